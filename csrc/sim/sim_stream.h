/* The simulated device's streams and events (the layouts behind core/device_backend.h's
 * gt_stream and gt_event for "sim").
 *
 * A stream is a FIFO of jobs run in order by a worker thread of its own, asynchronously to the
 * thread that queued them. A job's arguments are copied into the queue when it is queued, as a
 * GPU driver copies kernel arguments at launch. An event record is a job that marks the event
 * complete; an event wait is a job that blocks its worker until the event's record completes
 * on the other stream, so streams are ordered only through events, as on a GPU. Each device
 * has a default stream (NULL in the interface), created on first use.
 *
 * With the environment variable GPUTRAIN_SIM_DELAY_US=N (read once), each worker sleeps a
 * random 0..N microseconds before every job, to shake out missing waits. A failing job's
 * status is kept by its stream and returned by the next synchronisation (a sticky error). */
#ifndef GT_SIM_STREAM_H
#define GT_SIM_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "core/device_backend.h"

enum {
    GT_SIM_DEVICES = 2,          /* sim:0 and sim:1 */
    GT_SIM_ARGS_BYTES = 320,     /* room for one job's copied arguments */
};

/* A job: runs `args` (the copy made when it was queued) on the stream's worker. */
typedef gt_status (*gt_sim_job_fn)(void *args);

/* Queues fn with a copy of args_bytes (<= GT_SIM_ARGS_BYTES) at `args` on `stream` (NULL: the
 * default stream of device `index`); blocks only while the queue is full. */
gt_status gt_sim_enqueue(int index, gt_stream *stream, gt_sim_job_fn fn, const void *args, size_t args_bytes);

/* Blocks until every job queued on the stream so far has run; returns the first failure of a
 * job since the last synchronisation (and forgets it). */
gt_status gt_sim_stream_synchronize(int index, gt_stream *stream);

/* Synchronises every stream of device `index` (what freeing device memory waits for). */
void gt_sim_device_synchronize(int index);

gt_status gt_sim_stream_create(int index, gt_stream **out);
void gt_sim_stream_destroy(int index, gt_stream *stream);
gt_status gt_sim_stream_wait_event(int index, gt_stream *stream, gt_event *event);
void *gt_sim_stream_native(gt_stream *stream);
/* The live stream of sim:index whose native handle is `handle` (1 and 2: the default stream, NULL),
 * or GT_ERR_VALUE naming `arg_name` (the interface's stream_from_native). */
gt_status gt_sim_stream_from_native(int index, uintptr_t handle, const char *arg_name, gt_stream **out);

gt_status gt_sim_event_create(int index, gt_event **out);
void gt_sim_event_destroy(int index, gt_event *event);
gt_status gt_sim_event_record(int index, gt_event *event, gt_stream *stream);
gt_status gt_sim_event_query(int index, gt_event *event, int *done);
gt_status gt_sim_event_synchronize(int index, gt_event *event);

#endif
