// How long one thread takes to wake another through a condition variable, as PoCL's pthread
// device wakes its workers for each kernel and they wake the host when it ends: two threads
// pinned to the cores given on the command line hand a turn back and forth; prints the
// microseconds a round trip (two wake-ups) takes. bench/launch_floor.py compiles and runs it.
//
//     cc -O2 -pthread wake_latency.c -o wake_latency && ./wake_latency 0 1 [rounds]
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static int turn;  // 0: the main thread's, 1: the partner's
static long rounds = 20000;

static void pin(int core)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(core, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) {
        fprintf(stderr, "wake_latency: cannot pin a thread to core %d\n", core);
        exit(2);
    }
}

// Wait for ``mine``, then give the turn to ``theirs`` (after waking the other thread, the
// caller sleeps until the turn comes back, as a host sleeps in clFinish).
static void hand_over(int mine, int theirs)
{
    pthread_mutex_lock(&lock);
    while (turn != mine)
        pthread_cond_wait(&changed, &lock);
    turn = theirs;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
}

static void *partner(void *core)
{
    pin(*(int *)core);
    for (long i = 0; i < rounds; ++i)
        hand_over(1, 0);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: wake_latency MAIN_CORE PARTNER_CORE [ROUNDS]\n");
        return 2;
    }
    int main_core = atoi(argv[1]), partner_core = atoi(argv[2]);
    if (argc > 3)
        rounds = atol(argv[3]);
    pin(main_core);
    pthread_t thread;
    pthread_create(&thread, NULL, partner, &partner_core);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < rounds; ++i)
        hand_over(0, 1);
    pthread_join(thread, NULL);  // after the partner's last hand-over: ``rounds`` round trips
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double us = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3;
    printf("%.3f\n", us / rounds);
    return 0;
}
