/* The TCP transport: every message of an exchange is a 16-byte header (the collective's number
 * and the payload's bytes, in this machine's byte order) then the payload, queued on the
 * connection to its peer. Sockets are non-blocking and progressed with poll(), so an exchange
 * sends and receives with every peer at once (no deadlock on full socket buffers), partial
 * sends and receives resume where they stopped, and EINTR retries. A message that arrives
 * before its receive is posted (an overlapped bucket started later on this rank) waits in a
 * buffer of its own. A peer that closes its connection fails the exchange at once naming it;
 * a silent one fails it at the communicator's deadline; Ctrl-C (gt_interrupt_pending) abandons. */
#include "dist/comm_tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

enum { GT_TCP_HEADER = 16, GT_TCP_POLL_MS = 50 };

/* One message: a send queued on its peer's connection, a receive posted for it, or one that
 * arrived early (owner NULL, data its own). */
typedef struct tcp_msg {
    struct tcp_msg *next;                 /* the next in its list */
    gt_comm_pending *owner;               /* the exchange it belongs to; NULL: arrived early */
    uint64_t call;                        /* the collective's number */
    char *data;                           /* (bytes) the payload's memory */
    size_t bytes;                         /* payload bytes, > 0 */
    size_t done;                          /* bytes moved so far (a send's include its header) */
    unsigned char header[GT_TCP_HEADER];  /* call, bytes as two uint64 (a send's) */
} tcp_msg;

typedef struct tcp_peer {
    int fd;                               /* the connected socket, -1 for this rank */
    int closed;                           /* 1 once the peer closed it or it failed */
    int error;                            /* errno of that failure, 0 for an orderly close */
    tcp_msg *sends;                       /* queued sends, the head in progress */
    tcp_msg *posted;                      /* receives not yet matched to an incoming message */
    tcp_msg *early;                       /* complete messages whose receive is not posted yet */
    tcp_msg *incoming;                    /* the message being read after its header, or NULL */
    unsigned char header[GT_TCP_HEADER];  /* the next message's header, as read so far */
    size_t header_done;                   /* its bytes read */
} tcp_peer;

typedef struct tcp_transport {
    tcp_peer *peers;                      /* (size) one per rank */
    struct pollfd *polls;                 /* (size) poll()'s array */
} tcp_transport;

/* One exchange in flight: it completed when every message it queued or posted did. */
struct gt_comm_pending {
    size_t left;                          /* its messages not completed */
    uint64_t call;                        /* the collective's number */
    double deadline;                      /* CLOCK_MONOTONIC seconds past which it timed out */
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void msg_free(tcp_msg *m) {
    if (!m->owner)
        free(m->data);
    free(m);
}

static void list_free(tcp_msg *m) {
    while (m) {
        tcp_msg *next = m->next;
        msg_free(m);
        m = next;
    }
}

static void fail_peer(tcp_peer *peer, int error) { peer->closed = 1, peer->error = error; }

/* Sends what the socket takes of the queued messages, header and payload in one call. */
static void send_some(tcp_peer *peer) {
    while (peer->sends && !peer->closed) {
        tcp_msg *m = peer->sends;
        struct iovec io[2];
        int parts = 0;
        if (m->done < GT_TCP_HEADER)
            io[parts++] = (struct iovec){m->header + m->done, GT_TCP_HEADER - m->done};
        size_t sent = m->done < GT_TCP_HEADER ? 0 : m->done - GT_TCP_HEADER;
        io[parts++] = (struct iovec){m->data + sent, m->bytes - sent};
        ssize_t k = sendmsg(peer->fd, &(struct msghdr){.msg_iov = io, .msg_iovlen = (size_t)parts},
                            MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (k < 0) {
            fail_peer(peer, errno);
            return;
        }
        m->done += (size_t)k;
        if (m->done == GT_TCP_HEADER + m->bytes) {
            peer->sends = m->next;
            m->owner->left--;
            free(m);
        }
    }
}

/* Removes and returns the message of `call` from *list, or NULL. */
static tcp_msg *take(tcp_msg **list, uint64_t call) {
    for (; *list; list = &(*list)->next) {
        if ((*list)->call == call) {
            tcp_msg *m = *list;
            *list = m->next;
            return m;
        }
    }
    return NULL;
}

static gt_status size_mismatch(const gt_comm *comm, int p, uint64_t call, size_t got, size_t expected) {
    return GT_FAIL(GT_ERR_RUNTIME, "rank %d: rank %d sent %zu bytes for collective #%llu where %zu were expected: "
                   "the ranks called different collectives", comm->rank, p, got, (unsigned long long)call, expected);
}

/* A header arrived from peer p: its message goes to the posted receive, or to a buffer. */
static gt_status begin_incoming(gt_comm *comm, int p) {
    tcp_peer *peer = &((tcp_transport *)comm->impl)->peers[p];
    uint64_t call, bytes;
    memcpy(&call, peer->header, 8);
    memcpy(&bytes, peer->header + 8, 8);
    peer->header_done = 0;
    tcp_msg *m = take(&peer->posted, call);
    if (m && m->bytes != bytes)
        return size_mismatch(comm, p, call, (size_t)bytes, m->bytes);
    if (!m && bytes == 0)
        return GT_FAIL(GT_ERR_RUNTIME, "rank %d: rank %d sent an empty message: not a gputrain rank of this job?",
                       comm->rank, p);
    if (!m) {
        m = calloc(1, sizeof *m);
        if (!m || !(m->data = malloc((size_t)bytes))) {
            free(m);
            return GT_FAIL(GT_ERR_OOM, "rank %d: out of host memory for %llu bytes from rank %d", comm->rank,
                           (unsigned long long)bytes, p);
        }
        *m = (tcp_msg){.call = call, .data = m->data, .bytes = (size_t)bytes};
    }
    peer->incoming = m;
    return GT_OK;
}

static void finish_incoming(tcp_peer *peer) {
    tcp_msg *m = peer->incoming;
    peer->incoming = NULL;
    if (m->owner) {
        m->owner->left--;
        free(m);
    } else {
        m->next = peer->early;
        peer->early = m;
    }
}

/* Reads what the socket has from peer p: headers, then payloads into their receives. */
static gt_status recv_some(gt_comm *comm, int p) {
    tcp_peer *peer = &((tcp_transport *)comm->impl)->peers[p];
    while (!peer->closed) {
        tcp_msg *m = peer->incoming;
        char *into = m ? m->data + m->done : (char *)peer->header + peer->header_done;
        size_t want = m ? m->bytes - m->done : GT_TCP_HEADER - peer->header_done;
        ssize_t k = recv(peer->fd, into, want, MSG_DONTWAIT);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return GT_OK;
        if (k <= 0) {
            fail_peer(peer, k < 0 ? errno : 0);
            return GT_OK;
        }
        if (m && (m->done += (size_t)k) == m->bytes)
            finish_incoming(peer);
        if (!m && (peer->header_done += (size_t)k) == GT_TCP_HEADER)
            GT_TRY(begin_incoming(comm, p));
    }
    return GT_OK;
}

/* Waits up to wait_ms for any socket to be ready, then moves what it can on every one. */
static gt_status progress(gt_comm *comm, int wait_ms) {
    tcp_transport *t = comm->impl;
    for (int p = 0; p < comm->size; p++) {
        tcp_peer *peer = &t->peers[p];
        int open = p != comm->rank && !peer->closed;
        t->polls[p] = (struct pollfd){.fd = open ? peer->fd : -1, .events = POLLIN | (peer->sends ? POLLOUT : 0)};
    }
    if (poll(t->polls, (nfds_t)comm->size, wait_ms) < 0 && errno != EINTR)
        return GT_FAIL(GT_ERR_OS, "rank %d: poll() on the ranks' sockets failed: %s", comm->rank, strerror(errno));
    for (int p = 0; p < comm->size; p++) {
        if (t->polls[p].fd < 0 || !t->polls[p].revents)
            continue;
        send_some(&t->peers[p]);
        GT_TRY(recv_some(comm, p));
    }
    return GT_OK;
}

static gt_status queue_send(tcp_peer *peer, gt_comm_pending *x, const void *data, size_t bytes) {
    tcp_msg *m = calloc(1, sizeof *m);
    if (!m)
        return GT_FAIL(GT_ERR_OOM, "TCP transport: out of host memory");
    uint64_t call = x->call, size = bytes;
    *m = (tcp_msg){.owner = x, .call = x->call, .data = (char *)data, .bytes = bytes};
    memcpy(m->header, &call, 8);
    memcpy(m->header + 8, &size, 8);
    tcp_msg **tail = &peer->sends;
    while (*tail)
        tail = &(*tail)->next;
    *tail = m;
    x->left++;
    return GT_OK;
}

/* A receive of `bytes` into `data`: served from an early message, adopts the one being read,
 * or is posted. */
static gt_status post_recv(gt_comm *comm, int p, gt_comm_pending *x, void *data, size_t bytes) {
    tcp_peer *peer = &((tcp_transport *)comm->impl)->peers[p];
    tcp_msg *m = take(&peer->early, x->call);
    if (!m && peer->incoming && !peer->incoming->owner && peer->incoming->call == x->call)
        m = peer->incoming;
    if (m && m->bytes != bytes)
        return size_mismatch(comm, p, x->call, m->bytes, bytes);
    if (m) {
        memcpy(data, m->data, m->done);
        free(m->data);
        m->data = data, m->owner = x;
        if (m != peer->incoming)
            free(m);
        else
            x->left++;
        return GT_OK;
    }
    if (!(m = calloc(1, sizeof *m)))
        return GT_FAIL(GT_ERR_OOM, "TCP transport: out of host memory");
    *m = (tcp_msg){.next = peer->posted, .owner = x, .call = x->call, .data = data, .bytes = bytes};
    peer->posted = m;
    x->left++;
    return GT_OK;
}

/* Drops every message of x (the communicator is failed: its streams are out of step), then x. */
static void tcp_abandon(gt_comm *comm, gt_comm_pending *x) {
    tcp_transport *t = comm->impl;
    for (int p = 0; p < comm->size; p++) {
        tcp_peer *peer = &t->peers[p];
        tcp_msg **lists[2] = {&peer->sends, &peer->posted};
        for (int l = 0; l < 2; l++) {
            for (tcp_msg **at = lists[l]; *at;) {
                tcp_msg *m = *at;
                if (m->owner != x) {
                    at = &m->next;
                    continue;
                }
                peer->closed |= l == 0 && at == &peer->sends && m->done > 0;  /* half sent: the stream is cut */
                *at = m->next;
                free(m);
            }
        }
        if (peer->incoming && peer->incoming->owner == x) {
            free(peer->incoming);
            peer->incoming = NULL;
            peer->closed = 1;
        }
    }
    free(x);
}

static gt_status tcp_start(gt_comm *comm, uint64_t call, const void *const *send, const size_t *send_bytes,
                           void *const *recv, const size_t *recv_bytes, gt_comm_pending **out) {
    gt_comm_pending *x = calloc(1, sizeof *x);
    if (!x)
        return GT_FAIL(GT_ERR_OOM, "TCP transport: out of host memory");
    *x = (gt_comm_pending){.call = call, .deadline = now_s() + comm->timeout_s};
    tcp_transport *t = comm->impl;
    gt_status status = GT_OK;
    for (int p = 0; p < comm->size && status == GT_OK; p++) {
        if (p != comm->rank && recv_bytes[p])
            status = post_recv(comm, p, x, recv[p], recv_bytes[p]);
        if (p != comm->rank && send_bytes[p] && status == GT_OK)
            status = queue_send(&t->peers[p], x, send[p], send_bytes[p]);
    }
    if (status == GT_OK)
        status = progress(comm, 0);
    if (status != GT_OK) {
        tcp_abandon(comm, x);
        return status;
    }
    *out = x;
    return GT_OK;
}

/* 1 if x still waits on a message with peer p. */
static int waits_on(const tcp_peer *peer, const gt_comm_pending *x) {
    for (const tcp_msg *m = peer->sends; m; m = m->next)
        if (m->owner == x)
            return 1;
    for (const tcp_msg *m = peer->posted; m; m = m->next)
        if (m->owner == x)
            return 1;
    return peer->incoming && peer->incoming->owner == x;
}

/* Why x cannot complete (a peer closed, Ctrl-C, the deadline), or GT_OK. */
static gt_status check_waiting(gt_comm *comm, gt_comm_pending *x) {
    tcp_transport *t = comm->impl;
    for (int p = 0; p < comm->size; p++) {
        tcp_peer *peer = &t->peers[p];
        if (p != comm->rank && peer->closed && waits_on(peer, x))
            return GT_FAIL(GT_ERR_OS, "rank %d: collective #%llu: the connection with rank %d was closed (%s): "
                           "that rank exited or died", comm->rank, (unsigned long long)x->call, p,
                           peer->error ? strerror(peer->error) : "end of stream");
    }
    if (gt_interrupt_pending())
        return GT_FAIL(GT_ERR_INTERRUPTED, "rank %d: collective #%llu abandoned on an interrupt (Ctrl-C); the "
                       "communicator is unusable", comm->rank, (unsigned long long)x->call);
    if (now_s() > x->deadline) {
        int silent = -1;
        for (int p = 0; p < comm->size && silent < 0; p++)
            silent = p != comm->rank && waits_on(&t->peers[p], x) ? p : -1;
        return GT_FAIL(GT_ERR_TIMEOUT, "rank %d: collective #%llu with rank %d did not complete within "
                       "%g s (distributed timeout): that rank died or stopped calling the same "
                       "collectives", comm->rank, (unsigned long long)x->call, silent, comm->timeout_s);
    }
    return GT_OK;
}

static gt_status tcp_test(gt_comm *comm, gt_comm_pending *x, int *done) {
    GT_TRY(progress(comm, 0));
    *done = x->left == 0;
    if (*done) {
        free(x);
        return GT_OK;
    }
    return check_waiting(comm, x);
}

static gt_status tcp_exchange(gt_comm *comm, const void *const *send, const size_t *send_bytes, void *const *recv,
                              const size_t *recv_bytes) {
    gt_comm_pending *x = NULL;
    GT_TRY(tcp_start(comm, comm->calls, send, send_bytes, recv, recv_bytes, &x));
    gt_status status = GT_OK;
    while (x->left && status == GT_OK) {
        status = progress(comm, GT_TCP_POLL_MS);
        if (status == GT_OK && x->left)
            status = check_waiting(comm, x);
    }
    if (status != GT_OK) {
        tcp_abandon(comm, x);
        return status;
    }
    free(x);
    return GT_OK;
}

static void tcp_free(gt_comm *comm) {
    tcp_transport *t = comm->impl;
    if (!t)
        return;
    for (int p = 0; p < comm->size; p++) {
        tcp_peer *peer = &t->peers[p];
        if (peer->fd >= 0)
            close(peer->fd);
        list_free(peer->sends), list_free(peer->posted), list_free(peer->early);
        if (peer->incoming)
            msg_free(peer->incoming);
    }
    free(t->peers), free(t->polls), free(t);
    comm->impl = NULL;
}

static const gt_comm_ops tcp_ops = {.exchange = tcp_exchange, .start = tcp_start, .test = tcp_test,
                                    .abandon = tcp_abandon, .free = tcp_free};

/* Non-blocking, and TCP_NODELAY where it is TCP (the small headers go out at once). */
static gt_status prepare_socket(int fd, int p) {
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
        return GT_FAIL(GT_ERR_VALUE, "fds[%d]: %d is not an open socket (%s)", p, fd, strerror(errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  /* fails harmlessly on a Unix socket */
    return GT_OK;
}

gt_status gt_comm_tcp_create(const int *fds, int rank, int size, double timeout_s, gt_comm *comm) {
    if (size < 1 || rank < 0 || rank >= size)
        return GT_FAIL(GT_ERR_VALUE, "rank %d of world size %d: need 0 <= rank < size", rank, size);
    tcp_transport *t = calloc(1, sizeof *t);
    if (t) {
        t->peers = calloc((size_t)size, sizeof *t->peers);
        t->polls = calloc((size_t)size, sizeof *t->polls);
    }
    gt_status status = t && t->peers && t->polls ? GT_OK : GT_FAIL(GT_ERR_OOM, "TCP transport: out of host memory");
    for (int p = 0; p < size && status == GT_OK; p++)
        status = p == rank ? GT_OK : prepare_socket(fds[p], p);
    if (status != GT_OK) {
        if (t)
            free(t->peers), free(t->polls), free(t);
        return status;
    }
    for (int p = 0; p < size; p++)
        t->peers[p].fd = p == rank ? -1 : fds[p];
    *comm = (gt_comm){.ops = &tcp_ops, .impl = t, .rank = rank, .size = size, .timeout_s = timeout_s};
    status = gt_comm_init(comm);
    if (status != GT_OK) {
        for (int p = 0; p < size; p++)
            t->peers[p].fd = -1;  /* the caller's again */
        gt_comm_free(comm);
    }
    return status;
}
