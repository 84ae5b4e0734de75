/*
 * workers=auto while running (dl__pace_locked), over simulated windows of 8 batches in 0.1 s: the
 * workers' worth a consumer needs stays at work with half as much again to spare, so that it never
 * waits; the first batch it waits for brings half of those set aside back; nothing is set aside in
 * the four windows after, nor over a window the consumer spent in a pause, nor for the workers' wait
 * through a pause in the window after it.
 */
#include "core.h"
#include "test.h"

#include <math.h>

static dl_loader l;
static double now;

/* One window: NEEDED workers' worth decode for the consumer; the others wait for free slots; the
 * consumer waits for STARVED batches, and pauses PAUSE seconds before its first (every worker then
 * waiting for slots). Returns the workers at work after it. */
static int window_after(double pause, double needed, int starved) {
  double idle = l.pace.active > needed ? l.pace.active - needed : 0;
  now += pause;
  atomic_fetch_add(&l.st.slot_wait_ns, (int64_t)(l.pace.active * pause * 1e9));
  for (int b = 0; b < 8; b++) { /* a batch every 12.5 ms */
    now += 0.0125;
    l.st.batches++;
    atomic_fetch_add(&l.st.slot_wait_ns, (int64_t)(idle * 0.0125 * 1e9));
    if (b == 7) {
      l.st.starved += starved;
      l.st.consumer_wait_s += starved * 0.001;
    }
    dl__pace_locked(&l, now);
  }
  return l.pace.active;
}

static int window(double needed, int starved) { return window_after(0, needed, starved); }

/* A window whose consumer pauses PAUSE seconds after its fourth batch, every worker at work then
 * waiting for a slot; the waits end as the window's last batch frees a slot, after the window was
 * judged: they are the next window's to see only if counted where they end. */
static int pause_across(double pause, double needed) {
  double idle = l.pace.active > needed ? l.pace.active - needed : 0, from = 0;
  int waiting = l.pace.active;
  for (int b = 0; b < 8; b++) {
    now += 0.0125;
    if (b == 4) {
      from = now;
      l.pace.waiting += waiting, l.pace.since += waiting * from;
      now += pause;
    } else {
      atomic_fetch_add(&l.st.slot_wait_ns, (int64_t)(idle * 0.0125 * 1e9));
    }
    l.st.batches++;
    dl__pace_locked(&l, now);
  }
  l.pace.waiting -= waiting, l.pace.since -= waiting * from;
  atomic_fetch_add(&l.st.slot_wait_ns, (int64_t)(waiting * (now - from) * 1e9));
  return l.pace.active;
}

int main(void) {
  pthread_cond_init(&l.work_cv, NULL);
  l.o.workers = l.nworkers = 16;
  l.pace.on = true;
  l.pace.active = 16;
  l.st.batches = 3; /* the window starts after the first batches */
  now = 1;
  dl__pace_locked(&l, now);

  /* A consumer needing 6 workers' worth: workers go aside down to 9 (1.5 x 6), no further. */
  int active = 16, least = 16;
  for (int k = 0; k < 40; k++) {
    active = window(6, 0);
    least = active < least ? active : least;
  }
  ASSERT_EQ(active, 9);
  ASSERT_EQ(least, 9);
  ASSERT(strstr(l.pace.why, "the consumer kept up"));

  /* It waits for one batch: half of the 7 aside come back (4), and stay for four windows although
   * the workers idle again. */
  ASSERT_EQ(window(6, 1), 13);
  ASSERT(strstr(l.pace.why, "the consumer waited for 1 of the last 8 batches"));
  for (int k = 0; k < 4; k++)
    ASSERT_EQ(window(6, 0), 13);
  int kept = window(6, 0);
  ASSERT_LT(kept, 13);

  /* A consumer that pauses 3 s between windows: its workers stay, however long they wait. */
  for (int k = 0; k < 8; k++)
    ASSERT_EQ(window_after(3, 6, 0), kept);
  /* A pause in the middle of a window, the workers' waits through it ending after the window: the
   * window after it sets aside as a window with no pause would, to no fewer than 9 (counted where
   * they ended, those waits read as 300 workers' worth of surplus, and one worker was left). */
  ASSERT_EQ(pause_across(3, 6), kept);
  int after = window(6, 0);
  ASSERT(after >= 9 && after <= kept);

  /* A consumer needing next to nothing: one worker is kept. */
  for (int k = 0; k < 40; k++)
    active = window(0.05, 0);
  ASSERT_EQ(active, 1);

  /* A consumer needing all 16 at once, with 1 at work: it waits every window, and gets them all
   * back in halves (8, 4, 2, 1, 1 of those aside). */
  int expect[] = {9, 13, 15, 16, 16};
  for (int k = 0; k < 5; k++)
    ASSERT_EQ(window(16, 8), expect[k]);
  printf("workers=auto: 9 of 16 kept at work for a consumer needing 6; the first wait gives 4 back, "
         "kept for four windows; none set aside over a pause or for the waits through it; all back in four windows of waiting\n");
  return 0;
}
