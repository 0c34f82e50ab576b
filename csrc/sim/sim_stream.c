#include "sim/sim_stream.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { QUEUE_JOBS = 1024 };  /* jobs a stream holds before the queueing thread waits */

typedef struct sim_job {
    gt_sim_job_fn fn;                                       /* what the worker runs */
    _Alignas(16) unsigned char args[GT_SIM_ARGS_BYTES];     /* its arguments, copied when queued */
} sim_job;

struct gt_stream {
    int device;                /* sim ordinal */
    pthread_t worker;          /* runs the jobs in order */
    pthread_mutex_t lock;      /* guards the fields below */
    pthread_cond_t changed;    /* signalled when queued, done or stopping change */
    sim_job *jobs;             /* (QUEUE_JOBS,) ring: job q is jobs[q % QUEUE_JOBS] */
    uint64_t queued;           /* jobs queued since creation */
    uint64_t done;             /* jobs run since creation */
    int stopping;              /* 1 once destroy asked the worker to exit */
    gt_status failed;          /* first failure of a job since the last synchronisation */
    gt_error_state failure;    /* its message */
    unsigned seed;             /* state of the random delays */
    pid_t owner;               /* the process whose thread `worker` is (a forked child has none) */
    struct gt_stream *next;    /* next stream of the same device */
};

struct gt_event {
    pthread_mutex_t lock;      /* guards the fields below */
    pthread_cond_t fired;      /* signalled when `completed` grows */
    uint64_t recorded;         /* records queued so far */
    uint64_t completed;        /* the latest record whose work has run */
    int refs;                  /* 1 for the owner + 1 per queued job that uses the event */
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;  /* guards the two tables */
static gt_stream *default_streams[GT_SIM_DEVICES];  /* created on first use, never destroyed */
static gt_stream *device_streams[GT_SIM_DEVICES];   /* every live stream of each device */

/* ------------------------------------------------------------ delays -------------- */

static int delay_us;  /* GPUTRAIN_SIM_DELAY_US, 0 without */
static pthread_once_t delay_once = PTHREAD_ONCE_INIT;

static void read_delay(void) {
    const char *text = getenv("GPUTRAIN_SIM_DELAY_US");
    long value = text ? strtol(text, NULL, 10) : 0;
    delay_us = value > 0 && value < 1000000 ? (int)value : 0;
}

static void random_delay(gt_stream *s) {
    if (delay_us == 0)
        return;
    long us = rand_r(&s->seed) % (delay_us + 1);
    struct timespec pause = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&pause, NULL);
}

/* ------------------------------------------------------------ the worker ---------- */

static void finish_job(gt_stream *s, gt_status status) {
    pthread_mutex_lock(&s->lock);
    if (status != GT_OK && s->failed == GT_OK) {
        s->failed = status;
        gt_error_save(status, &s->failure);
    }
    s->done++;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    gt_clear_error();
}

static void *worker_main(void *arg) {
    gt_stream *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        while (s->done == s->queued && !s->stopping)
            pthread_cond_wait(&s->changed, &s->lock);
        int idle = s->done == s->queued;
        sim_job *job = &s->jobs[s->done % QUEUE_JOBS];  /* not reused before `done` passes it */
        pthread_mutex_unlock(&s->lock);
        if (idle)
            return NULL;
        random_delay(s);
        finish_job(s, job->fn(job->args));
    }
}

/* Starts the worker with every signal blocked, so signals reach the Python thread. */
static int start_worker(gt_stream *s) {
    sigset_t all, saved;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &saved);
    int rc = pthread_create(&s->worker, NULL, worker_main, s);
    pthread_sigmask(SIG_SETMASK, &saved, NULL);
    return rc;
}

/* ------------------------------------------------------------ streams ------------- */

static gt_status check_index(int index) {
    if (index < 0 || index >= GT_SIM_DEVICES)
        return GT_FAIL(GT_ERR_VALUE, "device: 'sim:%d' does not exist (%d simulated devices)", index,
                       GT_SIM_DEVICES);
    return GT_OK;
}

static gt_status new_stream(int index, gt_stream **out) {
    pthread_once(&delay_once, read_delay);
    gt_stream *s = calloc(1, sizeof *s);
    sim_job *jobs = s ? calloc(QUEUE_JOBS, sizeof *jobs) : NULL;
    if (!jobs) {
        free(s);
        return GT_FAIL(GT_ERR_OOM, "sim: out of host memory for a stream");
    }
    s->device = index;
    s->owner = getpid();
    s->jobs = jobs;
    s->seed = (unsigned)(uintptr_t)s ^ (unsigned)time(NULL);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->changed, NULL);
    if (start_worker(s) != 0) {
        pthread_cond_destroy(&s->changed);
        pthread_mutex_destroy(&s->lock);
        free(jobs);
        free(s);
        return GT_FAIL(GT_ERR_OS, "sim: cannot start a stream's worker thread");
    }
    *out = s;
    return GT_OK;
}

/* A new stream, added to its device's list. */
static gt_status register_stream(int index, gt_stream **out) {
    GT_TRY(new_stream(index, out));
    pthread_mutex_lock(&registry_lock);
    (*out)->next = device_streams[index];
    device_streams[index] = *out;
    pthread_mutex_unlock(&registry_lock);
    return GT_OK;
}

/* The stream itself, or the device's default stream for NULL (created on first use). */
static gt_status resolve(int index, gt_stream *stream, gt_stream **out) {
    GT_TRY(check_index(index));
    *out = stream;
    if (stream)
        return GT_OK;
    static pthread_mutex_t create_lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&create_lock);
    gt_status status = GT_OK;
    if (!default_streams[index])
        status = register_stream(index, &default_streams[index]);
    *out = default_streams[index];
    pthread_mutex_unlock(&create_lock);
    return status;
}

gt_status gt_sim_stream_create(int index, gt_stream **out) {
    *out = NULL;
    GT_TRY(check_index(index));
    return register_stream(index, out);
}

/* A stream inherited by a forked child: its worker thread stayed in the parent and its lock may
 * have been held there, so the child neither waits for it nor touches its lock. (A loader's
 * garbage from the parent, collected in a DataLoader worker, synchronises such streams.) */
static int orphaned(const gt_stream *s) { return s->owner != getpid(); }

/* Blocks until the jobs queued so far have run; the caller holds s->lock. */
static void wait_idle_locked(gt_stream *s) {
    uint64_t target = s->queued;
    while (s->done < target)
        pthread_cond_wait(&s->changed, &s->lock);
}

static void unregister(int index, gt_stream *s) {
    pthread_mutex_lock(&registry_lock);
    gt_stream **link = &device_streams[index];
    while (*link && *link != s)
        link = &(*link)->next;
    if (*link)
        *link = s->next;
    pthread_mutex_unlock(&registry_lock);
}

void gt_sim_stream_destroy(int index, gt_stream *s) {
    if (!s || orphaned(s))
        return;
    unregister(index, s);
    pthread_mutex_lock(&s->lock);
    s->stopping = 1;  /* the worker runs what is queued, then exits */
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->worker, NULL);
    pthread_cond_destroy(&s->changed);
    pthread_mutex_destroy(&s->lock);
    free(s->jobs);
    free(s);
}

gt_status gt_sim_enqueue(int index, gt_stream *stream, gt_sim_job_fn fn, const void *args, size_t args_bytes) {
    gt_stream *s = NULL;
    GT_TRY(resolve(index, stream, &s));
    if (args_bytes > GT_SIM_ARGS_BYTES)
        return GT_FAIL(GT_ERR_RUNTIME, "sim: %zu bytes of job arguments (at most %d)", args_bytes,
                       GT_SIM_ARGS_BYTES);
    if (orphaned(s))
        return GT_FAIL(GT_ERR_RUNTIME, "sim:%d: this process was forked from the one whose stream this is; "
                       "use sim in a process started with 'spawn' or 'forkserver'", index);
    pthread_mutex_lock(&s->lock);
    while (s->queued - s->done == QUEUE_JOBS)
        pthread_cond_wait(&s->changed, &s->lock);
    sim_job *job = &s->jobs[s->queued % QUEUE_JOBS];
    job->fn = fn;
    memcpy(job->args, args, args_bytes);
    s->queued++;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    return GT_OK;
}

gt_status gt_sim_stream_synchronize(int index, gt_stream *stream) {
    gt_stream *s = NULL;
    GT_TRY(resolve(index, stream, &s));
    if (orphaned(s))
        return GT_OK;  /* nothing of this process is queued there */
    pthread_mutex_lock(&s->lock);
    wait_idle_locked(s);
    gt_status failed = s->failed;
    gt_error_state failure = s->failure;
    s->failed = GT_OK;
    pthread_mutex_unlock(&s->lock);
    return failed == GT_OK ? GT_OK : gt_error_restore(&failure);
}

void gt_sim_device_synchronize(int index) {
    if (check_index(index) != GT_OK)
        return;
    pthread_mutex_lock(&registry_lock);
    for (gt_stream *s = device_streams[index]; s; s = s->next) {
        if (orphaned(s))
            continue;
        pthread_mutex_lock(&s->lock);
        wait_idle_locked(s);
        pthread_mutex_unlock(&s->lock);
    }
    pthread_mutex_unlock(&registry_lock);
}

void *gt_sim_stream_native(gt_stream *stream) { return stream; }

gt_status gt_sim_stream_from_native(int index, uintptr_t handle, const char *arg_name, gt_stream **out) {
    *out = NULL;
    GT_TRY(check_index(index));
    if (handle == 1 || handle == 2)  /* the default stream stands for both default streams */
        return GT_OK;
    pthread_mutex_lock(&registry_lock);
    gt_stream *s = device_streams[index];
    while (s && (uintptr_t)s != handle)
        s = s->next;
    pthread_mutex_unlock(&registry_lock);
    if (!s)
        return GT_FAIL(GT_ERR_VALUE, "%s: %#jx is not a stream of sim:%d (1: its default stream)", arg_name,
                       (uintmax_t)handle, index);
    *out = s;
    return GT_OK;
}

/* ------------------------------------------------------------ events -------------- */

typedef struct event_job {
    gt_event *event;   /* the event recorded or waited for */
    uint64_t record;   /* which record of it */
} event_job;

static void event_release(gt_event *e) {
    pthread_mutex_lock(&e->lock);
    int last = --e->refs == 0;
    pthread_mutex_unlock(&e->lock);
    if (!last)
        return;
    pthread_cond_destroy(&e->fired);
    pthread_mutex_destroy(&e->lock);
    free(e);
}

static gt_status complete_job(void *args) {
    event_job *job = args;
    gt_event *e = job->event;
    pthread_mutex_lock(&e->lock);
    if (job->record > e->completed)
        e->completed = job->record;
    pthread_cond_broadcast(&e->fired);
    pthread_mutex_unlock(&e->lock);
    event_release(e);
    return GT_OK;
}

static gt_status wait_job(void *args) {
    event_job *job = args;
    gt_event *e = job->event;
    pthread_mutex_lock(&e->lock);
    while (e->completed < job->record)
        pthread_cond_wait(&e->fired, &e->lock);
    pthread_mutex_unlock(&e->lock);
    event_release(e);
    return GT_OK;
}

gt_status gt_sim_event_create(int index, gt_event **out) {
    *out = NULL;
    GT_TRY(check_index(index));
    gt_event *e = calloc(1, sizeof *e);
    if (!e)
        return GT_FAIL(GT_ERR_OOM, "sim: out of host memory for an event");
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->fired, NULL);
    e->refs = 1;
    *out = e;
    return GT_OK;
}

void gt_sim_event_destroy(int index, gt_event *event) {
    (void)index;
    if (event)
        event_release(event);
}

/* Takes a reference for a job and returns the record it is about (`next`: a new record). */
static uint64_t event_hold(gt_event *e, int next) {
    pthread_mutex_lock(&e->lock);
    e->refs++;
    uint64_t record = next ? ++e->recorded : e->recorded;
    pthread_mutex_unlock(&e->lock);
    return record;
}

gt_status gt_sim_event_record(int index, gt_event *event, gt_stream *stream) {
    event_job job = {event, event_hold(event, 1)};
    gt_status status = gt_sim_enqueue(index, stream, complete_job, &job, sizeof job);
    if (status != GT_OK)
        complete_job(&job);  /* nothing will run it: the record completes at once */
    return status;
}

gt_status gt_sim_stream_wait_event(int index, gt_stream *stream, gt_event *event) {
    event_job job = {event, event_hold(event, 0)};
    gt_status status = gt_sim_enqueue(index, stream, wait_job, &job, sizeof job);
    if (status != GT_OK)
        event_release(event);
    return status;
}

gt_status gt_sim_event_query(int index, gt_event *e, int *done) {
    GT_TRY(check_index(index));
    pthread_mutex_lock(&e->lock);
    *done = e->completed >= e->recorded;
    pthread_mutex_unlock(&e->lock);
    return GT_OK;
}

gt_status gt_sim_event_synchronize(int index, gt_event *e) {
    GT_TRY(check_index(index));
    pthread_mutex_lock(&e->lock);
    uint64_t target = e->recorded;
    while (e->completed < target)
        pthread_cond_wait(&e->fired, &e->lock);
    pthread_mutex_unlock(&e->lock);
    return GT_OK;
}
