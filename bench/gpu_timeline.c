/*
 * A GPU timeline without Nsight Systems: a CUPTI injection library. Any CUDA program run with
 *   CUDA_INJECTION64_PATH=.../libgpu_timeline.so GPU_TIMELINE_OUT=trace.tsv program ...
 * writes one line per activity: kernels, copies and memsets with their GPU times and streams,
 * event records with the GPU time they passed, the host's waits (event, stream, context), and
 * every CUDA runtime and driver call with its thread. bench/timeline_gaps.py reads it.
 *
 * Lines (tab-separated, times in ns on CUPTI's clock):
 *   K start end stream correlation name grid block shared-bytes
 *   M start end stream correlation bytes copy-kind
 *   S start end stream correlation bytes
 *   E device-time 0 stream correlation event-id
 *   Y start end stream correlation sync-type event-id
 *   R|D start end thread correlation call-name
 */
#include <cupti.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define BUFFER_BYTES (8u << 20)

static FILE *out;
static pthread_mutex_t out_mu = PTHREAD_MUTEX_INITIALIZER;

static void CUPTIAPI buffer_wanted(uint8_t **buffer, size_t *size, size_t *max_records) {
  *buffer = aligned_alloc(8, BUFFER_BYTES);
  *size = *buffer ? BUFFER_BYTES : 0;
  *max_records = 0;
}

static void write_record(const CUpti_Activity *r) {
  switch (r->kind) {
  case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
  case CUPTI_ACTIVITY_KIND_KERNEL: {
    const CUpti_ActivityKernel10 *k = (const void *)r;
    fprintf(out, "K\t%llu\t%llu\t%u\t%u\t%s\t%d\t%d\t%d\n", (unsigned long long)k->start, (unsigned long long)k->end,
            k->streamId, k->correlationId, k->name ? k->name : "?", k->gridX * k->gridY * k->gridZ,
            k->blockX * k->blockY * k->blockZ, k->staticSharedMemory + k->dynamicSharedMemory);
    break;
  }
  case CUPTI_ACTIVITY_KIND_MEMCPY: {
    const CUpti_ActivityMemcpy6 *m = (const void *)r;
    fprintf(out, "M\t%llu\t%llu\t%u\t%u\t%llu\t%u\n", (unsigned long long)m->start, (unsigned long long)m->end,
            m->streamId, m->correlationId, (unsigned long long)m->bytes, m->copyKind);
    break;
  }
  case CUPTI_ACTIVITY_KIND_MEMSET: {
    const CUpti_ActivityMemset4 *m = (const void *)r;
    fprintf(out, "S\t%llu\t%llu\t%u\t%u\t%llu\n", (unsigned long long)m->start, (unsigned long long)m->end,
            m->streamId, m->correlationId, (unsigned long long)m->bytes);
    break;
  }
  case CUPTI_ACTIVITY_KIND_CUDA_EVENT: {
    const CUpti_ActivityCudaEvent2 *e = (const void *)r;
    fprintf(out, "E\t%llu\t0\t%u\t%u\t%u\n", (unsigned long long)e->deviceTimestamp, e->streamId, e->correlationId,
            e->eventId);
    break;
  }
  case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
    const CUpti_ActivitySynchronization2 *s = (const void *)r;
    fprintf(out, "Y\t%llu\t%llu\t%u\t%u\t%d\t%u\n", (unsigned long long)s->start, (unsigned long long)s->end,
            s->streamId, s->correlationId, (int)s->type, s->cudaEventId);
    break;
  }
  case CUPTI_ACTIVITY_KIND_RUNTIME:
  case CUPTI_ACTIVITY_KIND_DRIVER: {
    const CUpti_ActivityAPI *a = (const void *)r;
    const char *name = "?";
    cuptiGetCallbackName(r->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API,
                         a->cbid, &name);
    fprintf(out, "%c\t%llu\t%llu\t%u\t%u\t%s\n", r->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? 'R' : 'D',
            (unsigned long long)a->start, (unsigned long long)a->end, a->threadId, a->correlationId, name);
    break;
  }
  default:
    break;
  }
}

static void CUPTIAPI buffer_done(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
  (void)ctx, (void)stream, (void)size;
  CUpti_Activity *r = NULL;
  pthread_mutex_lock(&out_mu);
  while (out && cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS)
    write_record(r);
  size_t dropped = 0;
  if (out && cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
    fprintf(out, "#\tdropped %zu records\n", dropped);
  pthread_mutex_unlock(&out_mu);
  free(buffer);
}

static void finish(void) {
  cuptiActivityFlushAll(1);
  pthread_mutex_lock(&out_mu);
  if (out)
    fclose(out);
  out = NULL;
  pthread_mutex_unlock(&out_mu);
}

/* Called by the CUDA driver when it starts, where CUDA_INJECTION64_PATH names this library. */
__attribute__((visibility("default"))) int InitializeInjection(void) {
  const char *path = getenv("GPU_TIMELINE_OUT");
  if (!path || !(out = fopen(path, "w"))) {
    fprintf(stderr, "gpu_timeline: set GPU_TIMELINE_OUT to a file to write\n");
    return 0;
  }
  static const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                             CUPTI_ACTIVITY_KIND_MEMSET,            CUPTI_ACTIVITY_KIND_CUDA_EVENT,
                                             CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,   CUPTI_ACTIVITY_KIND_RUNTIME,
                                             CUPTI_ACTIVITY_KIND_DRIVER};
  CUptiResult r = cuptiActivityRegisterCallbacks(buffer_wanted, buffer_done);
  for (size_t i = 0; r == CUPTI_SUCCESS && i < sizeof kinds / sizeof kinds[0]; i++)
    r = cuptiActivityEnable(kinds[i]);
  if (r == CUPTI_SUCCESS)
    r = cuptiActivityEnableCudaEventDeviceTimestamps(1);
  if (r != CUPTI_SUCCESS) {
    const char *why = "?";
    cuptiGetResultString(r, &why);
    fprintf(stderr, "gpu_timeline: CUPTI would not trace: %s\n", why);
    fclose(out);
    out = NULL;
    return 0;
  }
  atexit(finish);
  return 1;
}
