/*
 * Where a process's threads wait while a part of its work runs (bench/nvjpeg_start --sample).
 * Every millisecond a sampler thread reads, for each thread, its system call (or running), the
 * kernel function it sleeps in and its name, and counts them by part. For a futex wait it also
 * reads whether the wait has a timeout (and how much of it is left), where the futex word lies,
 * and the libraries named by the words on the waiting thread's stack. The starting thread's futex
 * waits are timed one by one.
 * This file also defines pthread_create and pthread_join, which the program exports
 * (--export-dynamic-symbol): they stand before libc's for every library, so the program can say
 * which library made or joined a thread, and when.
 */
#ifndef RINGFEED_BENCH_THREAD_WAITS_H
#define RINGFEED_BENCH_THREAD_WAITS_H

#include <stdbool.h>

/* The calling thread is the one whose futex waits are timed. */
void waits_starter(void);
/* The part now running: 1 or 2 (0: none, not sampled). */
void waits_part(int part);
/* Starts and stops the sampler thread (false: it could not start). */
bool waits_sampler_start(void);
void waits_sampler_stop(void);
/* PART's places and waits, as JSON members prefixed with NAME (",\"NAME_places\":{...}..."). */
void waits_print(const char *name, int part);
/* The threads made and joined, by whom and in which part, as JSON members. */
void waits_threads_print(void);

#endif
