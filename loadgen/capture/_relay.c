/* The capture proxy's compiled body pump: moves the bodies of upstream replies to their clients.
 *
 * The relay (proxy.py) takes the request with aiohttp, sends it upstream and parses the reply's
 * head (upstream_connection.py); from then on, for a plain-TCP upstream, the body goes through a
 * Pump: per readable upstream socket one recv, the de-framing of the upstream's body (chunked,
 * Content-Length or to the close), one send of the pieces to the client (framed as chunked when
 * the client's reply is), and for a recorded exchange one (CHUNK, xid, t_ns, piece) tuple appended
 * to the feed's event list, t_ns taken before the send as the Python relay does. No Python frame
 * runs per chunk; Python hears only of the exchanges that ended (their body done, the upstream
 * broken off or silent, the client gone or stalled).
 *
 * The reference is the Python relay: UpstreamConnection's decoder in upstream_connection.py (this
 * de-framer keeps its grammar, limits and error messages) and _ClientSink in proxy.py.
 * tests/unit/test_relay_pump_diff.py feeds both the same byte streams, cut anywhere, and requires
 * the same pieces, ends and errors; the proxy's integration tests run on both relays.
 *
 * Each exchange works on dup'd descriptors of both sockets, so a socket that aiohttp or uvloop
 * closes cannot have its number reused under the pump; the dups leave the epoll set explicitly
 * before they are closed (closing a dup alone would leave the registration of the shared file).
 * The epoll set is level-triggered: the loop watches its descriptor with add_reader and calls
 * run() while anything is ready. A client slower than its upstream keeps the unsent rest here;
 * the upstream's socket leaves the set until the client has taken it (EPOLLOUT). The client's
 * socket is always watched for EPOLLRDHUP: a client that shut its side or vanished is gone, as
 * aiohttp (which closes on a client's EOF) would tell the Python relay.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* How the upstream's body is framed (the caller's UpstreamConnection state). */
enum { F_LENGTH = 0, F_CHUNKED = 1, F_CLOSE = 2 };
/* Where the chunked decoder is: the values of upstream_connection.py's _SIZE.._TRAILER. */
enum { C_SIZE = 0, C_DATA = 1, C_DATA_END = 2, C_TRAILER = 3 };
/* How an exchange ended (run()'s and expire()'s reports). */
enum {
    ST_DONE = 0,            /* the body ended where its framing says, nothing after it */
    ST_DONE_NO_REUSE = 1,   /* the body ended, but the connection cannot carry another reply */
    ST_UPSTREAM = 2,        /* the upstream broke off (message says how) */
    ST_CLIENT = 3,          /* the client went away */
    ST_UPSTREAM_SILENT = 4, /* no byte from the upstream for the timeout */
    ST_CLIENT_STALLED = 5,  /* the client took nothing of the unsent rest for the timeout */
};

#define READ_BYTES 65536
#define MAX_SIZE_LINE 1024     /* upstream_connection._MAX_SIZE_LINE */
#define MAX_TRAILER 65536      /* upstream_connection.MAX_HEAD_BYTES */
#define CARRY_MAX (MAX_TRAILER + 2)
#define FRAME_HEAD 20          /* room for "%x\r\n" before a piece */
#define EVENTS 128

typedef struct {
    int used;
    uint32_t gen;
    int up, cl;                /* dup'd descriptors */
    int framing, cstate;
    int64_t left;              /* of a Content-Length body, or of the current chunk */
    char *carry;               /* a chunk-size line, chunk end or trailer line cut by a read */
    Py_ssize_t carry_len;
    int out_chunked;
    long long xid;             /* 0: the pieces are not recorded */
    char *pend;                /* what the client's socket did not take yet */
    Py_ssize_t pend_len, pend_off;
    int reading;               /* the upstream's socket is in the epoll set */
    int cl_events;             /* the client's socket's registered events */
    int ending;                /* the body is whole; its status waits for the unsent rest */
    int end_status;
    long long last_up_ns, last_cl_ns;
} Relay;

typedef struct {
    PyObject_HEAD
    int epfd;
    int epfd_open;
    Relay *slots;
    int nslots;
    int count;
    uint32_t next_gen;
    PyObject *events;          /* the feed's list: CHUNK tuples are appended to it */
    PyObject *chunk_tag;
    PyObject *done;            /* ends found outside run() (start's first send), for the next run() */
    char *scratch;             /* carry + one read */
    char *out;                 /* one read's pieces, framed */
} Pump;

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int fcntl_dup(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, 0); }

static PyObject *handle_of(int slot, uint32_t gen) {
    return PyLong_FromUnsignedLongLong(((unsigned long long)gen << 24) | (unsigned)slot);
}

static uint64_t key_of(int slot, uint32_t gen, int client) {
    return ((uint64_t)gen << 32) | ((uint32_t)slot << 1) | (uint32_t)client;
}

static int set_client_events(Pump *p, int slot, int events) {
    Relay *r = &p->slots[slot];
    if (r->cl_events == events) return 0;
    struct epoll_event ev = {.events = (uint32_t)events, .data.u64 = key_of(slot, r->gen, 1)};
    return epoll_ctl(p->epfd, EPOLL_CTL_MOD, r->cl, &ev) < 0 ? -1 : (r->cl_events = events, 0);
}

static int set_reading(Pump *p, int slot, int on) {
    Relay *r = &p->slots[slot];
    if (r->reading == on) return 0;
    if (on) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = key_of(slot, r->gen, 0)};
        if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, r->up, &ev) < 0) return -1;
    } else {
        /* DEL, not MOD to no events: EPOLLHUP would still be reported, over and over */
        epoll_ctl(p->epfd, EPOLL_CTL_DEL, r->up, NULL);
    }
    r->reading = on;
    return 0;
}

static void release(Pump *p, int slot) {
    Relay *r = &p->slots[slot];
    if (!r->used) return;
    if (r->reading) epoll_ctl(p->epfd, EPOLL_CTL_DEL, r->up, NULL);
    epoll_ctl(p->epfd, EPOLL_CTL_DEL, r->cl, NULL);
    close(r->up);
    close(r->cl);
    PyMem_Free(r->carry);
    PyMem_Free(r->pend);
    memset(r, 0, sizeof(*r));
    p->count--;
}

/* Report slot's end into `ended` and free the slot. -1 only when Python ran out of memory. */
static int report(Pump *p, PyObject *ended, int slot, int status, PyObject *message) {
    Relay *r = &p->slots[slot];
    PyObject *h = handle_of(slot, r->gen);
    release(p, slot);
    if (h == NULL) return -1;
    PyObject *item = Py_BuildValue("(NiO)", h, status, message ? message : Py_None);
    if (item == NULL) return -1;
    int rc = PyList_Append(ended, item);
    Py_DECREF(item);
    return rc;
}

static int report_text(Pump *p, PyObject *ended, int slot, int status, const char *text) {
    PyObject *m = PyUnicode_FromString(text);
    if (m == NULL) return -1;
    int rc = report(p, ended, slot, status, m);
    Py_DECREF(m);
    return rc;
}

/* Send the unsent rest. 1: all of it went; 0: some is left (EPOLLOUT watched); -1: the client is
 * gone; -2: a Python error (memory). */
static int flush_pending(Pump *p, int slot) {
    Relay *r = &p->slots[slot];
    while (r->pend_off < r->pend_len) {
        ssize_t n = send(r->cl, r->pend + r->pend_off, (size_t)(r->pend_len - r->pend_off), MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (set_client_events(p, slot, EPOLLRDHUP | EPOLLOUT) < 0) return -1;
                return 0;
            }
            return -1;
        }
        r->pend_off += n;
        r->last_cl_ns = now_ns();
    }
    r->pend_off = r->pend_len = 0;
    if (set_client_events(p, slot, EPOLLRDHUP) < 0) return -1;
    return 1;
}

/* Give one piece (out[FRAME_HEAD .. FRAME_HEAD+len]) to the client and the feed. The buffer has
 * FRAME_HEAD bytes free before the piece and 2 after it, for chunked framing.
 * 1: sent whole; 0: part is kept for later (reading stops); -1: the client is gone; -2: Python error. */
static int give(Pump *p, int slot, char *buf, Py_ssize_t len) {
    Relay *r = &p->slots[slot];
    char *piece = buf + FRAME_HEAD;
    char *start = piece;
    Py_ssize_t total = len;
    if (r->out_chunked) {
        /* "%zx\r\n", written backwards in front of the piece (snprintf cost more than the rest) */
        static const char digits[] = "0123456789abcdef";
        start = piece - 2;
        start[0] = '\r';
        start[1] = '\n';
        size_t v = (size_t)len;
        do {
            *--start = digits[v & 15];
            v >>= 4;
        } while (v);
        int h = (int)(piece - start);
        piece[len] = '\r';
        piece[len + 1] = '\n';
        total = len + h + 2;
    }
    long long t = now_ns();  /* before the send: never after the client had it */
    Py_ssize_t sent = 0;
    int was_empty = r->pend_len == 0;
    if (was_empty) {
        while (sent < total) {
            ssize_t n = send(r->cl, start + sent, (size_t)(total - sent), MSG_NOSIGNAL);
            if (n < 0) {
                if (errno == EINTR) continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK) break;
                return -1;
            }
            sent += n;
        }
    }
    if (sent < total) {  /* keep the rest; stop reading until the client has taken it */
        Py_ssize_t rest = total - sent;
        char *pend = PyMem_Realloc(r->pend, (size_t)(r->pend_len + rest));
        if (pend == NULL) {
            PyErr_NoMemory();
            return -2;
        }
        memcpy(pend + r->pend_len, start + sent, (size_t)rest);
        r->pend = pend;
        r->pend_len += rest;
        if (was_empty) r->last_cl_ns = t;  /* the client's stall is timed from here */
        if (set_reading(p, slot, 0) < 0 || set_client_events(p, slot, EPOLLRDHUP | EPOLLOUT) < 0) return -1;
    }
    if (r->xid) {
        PyObject *ev = Py_BuildValue("(OLLy#)", p->chunk_tag, r->xid, t, piece, len);
        if (ev == NULL) return -2;
        int rc = PyList_Append(p->events, ev);
        Py_DECREF(ev);
        if (rc < 0) return -2;
    }
    return sent < total ? 0 : 1;
}

static int is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static const char *find_crlf(const char *s, Py_ssize_t from, Py_ssize_t n) {
    for (Py_ssize_t i = from; i + 1 < n; i++) {
        const char *cr = memchr(s + i, '\r', (size_t)(n - 1 - i));
        if (cr == NULL) return NULL;
        if (cr[1] == '\n') return cr;
        i = cr - s;
    }
    return NULL;
}

/* The outcome of decoding one read (decode's return). */
enum { D_MORE = 0, D_END = 1, D_ERROR = 2 };

/* De-frame buf[0..n) of a chunked body, appending the data to out (at *out_len), as
 * UpstreamConnection._chunked_data does; *extra is what followed the body's end. On D_ERROR,
 * *error holds the message (a new reference) and the read's pieces are dropped, as there. */
static int decode_chunked(Relay *r, const char *buf, Py_ssize_t n, char *out, Py_ssize_t *out_len,
                          Py_ssize_t *extra, PyObject **error) {
    Py_ssize_t pos = 0;
    while (pos < n) {
        if (r->cstate == C_DATA) {
            Py_ssize_t take = n - pos;
            if ((int64_t)take > r->left) take = (Py_ssize_t)r->left;
            memcpy(out + *out_len, buf + pos, (size_t)take);
            *out_len += take;
            pos += take;
            r->left -= take;
            if (!r->left) r->cstate = C_DATA_END;
        } else if (r->cstate == C_SIZE) {
            const char *eol = find_crlf(buf, pos, n);
            if (eol == NULL) {
                if (n - pos > MAX_SIZE_LINE) {
                    *error = PyUnicode_FromString("the upstream's chunk-size line is too long");
                    return D_ERROR;
                }
                goto carry;
            }
            const char *a = buf + pos, *b = eol;
            const char *semi = memchr(a, ';', (size_t)(b - a));
            if (semi != NULL) b = semi;
            while (a < b && (*a == ' ' || *a == '\t')) a++;
            while (b > a && (b[-1] == ' ' || b[-1] == '\t')) b--;
            int bad = a == b;
            uint64_t size = 0;
            for (const char *c = a; c < b && !bad; c++) {
                if (!is_hex(*c)) {
                    bad = 1;
                    break;
                }
                int d = *c <= '9' ? *c - '0' : (*c | 0x20) - 'a' + 10;
                /* past 2^60 the chunk cannot come anyway: keep it there rather than overflow */
                size = size >= ((uint64_t)1 << 60) ? size : (size << 4) | (uint64_t)d;
            }
            if (bad) {
                Py_ssize_t shown = b - a > 40 ? 40 : b - a;
                PyObject *raw = PyBytes_FromStringAndSize(a, shown);
                if (raw == NULL) return -1;
                *error = PyUnicode_FromFormat("the upstream sent a bad chunk size: %R", raw);
                Py_DECREF(raw);
                return *error == NULL ? -1 : D_ERROR;
            }
            pos = eol - buf + 2;
            r->left = (int64_t)size;
            r->cstate = size ? C_DATA : C_TRAILER;
        } else if (r->cstate == C_DATA_END) {
            if (n - pos < 2) goto carry;
            if (buf[pos] != '\r' || buf[pos + 1] != '\n') {
                *error = PyUnicode_FromString("the upstream's chunk does not end where its size says");
                return D_ERROR;
            }
            pos += 2;
            r->cstate = C_SIZE;
        } else {  /* C_TRAILER: lines up to an empty one, dropped */
            const char *eol = find_crlf(buf, pos, n);
            if (eol == NULL) {
                if (n - pos > MAX_TRAILER) {
                    *error = PyUnicode_FromString("the upstream's chunked trailer is too long");
                    return D_ERROR;
                }
                goto carry;
            }
            if (eol == buf + pos) {
                *extra = n - (pos + 2);
                return D_END;
            }
            pos = eol - buf + 2;
        }
    }
    return D_MORE;
carry:
    memcpy(r->carry, buf + pos, (size_t)(n - pos));
    r->carry_len = n - pos;
    return D_MORE;
}

/* Read the upstream once and pass on what came. 0: goes on; 1: ended (reported); -1: Python error. */
static int pump_read(Pump *p, int slot, PyObject *ended) {
    Relay *r = &p->slots[slot];
    char *buf = p->scratch;
    Py_ssize_t have = r->carry_len;
    if (have) memcpy(buf, r->carry, (size_t)have);
    ssize_t got;
    do {
        got = recv(r->up, buf + have, READ_BYTES, 0);
    } while (got < 0 && errno == EINTR);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (got <= 0) {  /* the close, or a failure the Python relay also sees as its connection lost */
        if (r->framing == F_CLOSE) {
            r->ending = 1;
            r->end_status = ST_DONE_NO_REUSE;
            if (set_reading(p, slot, 0) < 0) return -1;
            if (r->pend_len) return 0;
            return report(p, ended, slot, ST_DONE_NO_REUSE, NULL) < 0 ? -1 : 1;
        }
        return report_text(p, ended, slot, ST_UPSTREAM, "the upstream closed the connection mid-reply") < 0 ? -1 : 1;
    }
    r->last_up_ns = now_ns();
    Py_ssize_t n = have + got;
    r->carry_len = 0;
    char *out = p->out;
    Py_ssize_t len = 0, extra = 0;
    int state = D_MORE;
    PyObject *error = NULL;
    if (r->framing == F_CHUNKED) {
        state = decode_chunked(r, buf, n, out + FRAME_HEAD, &len, &extra, &error);
        if (state < 0) return -1;
        if (state == D_ERROR) {
            int rc = report(p, ended, slot, ST_UPSTREAM, error);
            Py_DECREF(error);
            return rc < 0 ? -1 : 1;
        }
    } else {
        len = n;
        if (r->framing == F_LENGTH) {
            if ((int64_t)n >= r->left) {
                len = (Py_ssize_t)r->left;
                extra = n - len;
                state = D_END;
            }
            r->left -= len;
        }
        memcpy(out + FRAME_HEAD, buf, (size_t)len);
    }
    if (len) {
        int g = give(p, slot, out, len);
        if (g == -2) return -1;
        if (g == -1) return report_text(p, ended, slot, ST_CLIENT, "the client left mid-reply") < 0 ? -1 : 1;
    }
    if (state == D_END) {
        int status = extra ? ST_DONE_NO_REUSE : ST_DONE;
        if (set_reading(p, slot, 0) < 0) return -1;
        if (r->pend_len) {  /* the end is told once the client has all of it */
            r->ending = 1;
            r->end_status = status;
            return 0;
        }
        return report(p, ended, slot, status, NULL) < 0 ? -1 : 1;
    }
    return 0;
}

static int Pump_init(Pump *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"events", "chunk_tag", NULL};
    PyObject *events, *tag;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O:Pump", kwlist, &PyList_Type, &events, &tag)) return -1;
    if (self->epfd_open) {
        PyErr_SetString(PyExc_RuntimeError, "Pump: already initialised");
        return -1;
    }
    self->scratch = PyMem_Malloc(CARRY_MAX + READ_BYTES);
    self->out = PyMem_Malloc(FRAME_HEAD + CARRY_MAX + READ_BYTES + 2);
    self->done = PyList_New(0);
    if (self->scratch == NULL || self->out == NULL || self->done == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (self->epfd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->epfd_open = 1;
    Py_INCREF(events);
    self->events = events;
    Py_INCREF(tag);
    self->chunk_tag = tag;
    return 0;
}

static void Pump_dealloc(Pump *self) {
    for (int i = 0; i < self->nslots; i++) release(self, i);
    PyMem_Free(self->slots);
    PyMem_Free(self->scratch);
    PyMem_Free(self->out);
    Py_XDECREF(self->events);
    Py_XDECREF(self->chunk_tag);
    Py_XDECREF(self->done);
    if (self->epfd_open) close(self->epfd);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Relay *slot_of(Pump *self, PyObject *handle, int *slot_out) {
    unsigned long long h = PyLong_AsUnsignedLongLong(handle);
    if (h == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    int slot = (int)(h & 0xffffff);
    uint32_t gen = (uint32_t)(h >> 24);
    if (slot >= self->nslots || !self->slots[slot].used || self->slots[slot].gen != gen) return NULL;
    *slot_out = slot;
    return &self->slots[slot];
}

/* start(upstream_fd, client_fd, framing, left, chunk_state, carry, out_chunked, xid, early) -> handle
 * The upstream's reading must be paused (its transport's); `early` is body that came with the head. */
static PyObject *Pump_start(Pump *self, PyObject *args) {
    int up_fd, cl_fd, framing, cstate, out_chunked;
    long long left, xid;
    const char *carry, *early;
    Py_ssize_t carry_len, early_len;
    if (!PyArg_ParseTuple(args, "iiiLiy#pLy#:start", &up_fd, &cl_fd, &framing, &left, &cstate, &carry,
                          &carry_len, &out_chunked, &xid, &early, &early_len))
        return NULL;
    if (!self->epfd_open) {
        PyErr_SetString(PyExc_ValueError, "Pump: not initialised");
        return NULL;
    }
    if (framing < F_LENGTH || framing > F_CLOSE || cstate < C_SIZE || cstate > C_TRAILER || carry_len > CARRY_MAX ||
        (framing == F_LENGTH && left <= 0)) {
        PyErr_SetString(PyExc_ValueError, "start: a body state the relay cannot be in");
        return NULL;
    }
    int slot = -1;
    for (int i = 0; i < self->nslots; i++)
        if (!self->slots[i].used) {
            slot = i;
            break;
        }
    if (slot < 0) {
        int n = self->nslots ? self->nslots * 2 : 64;
        if (n > 0xffffff) {
            PyErr_SetString(PyExc_OverflowError, "Pump: too many exchanges");
            return NULL;
        }
        Relay *s = PyMem_Realloc(self->slots, (size_t)n * sizeof(Relay));
        if (s == NULL) return PyErr_NoMemory();
        memset(s + self->nslots, 0, (size_t)(n - self->nslots) * sizeof(Relay));
        slot = self->nslots;
        self->slots = s;
        self->nslots = n;
    }
    Relay *r = &self->slots[slot];
    char *carry_buf = PyMem_Malloc(CARRY_MAX);
    if (carry_buf == NULL) return PyErr_NoMemory();
    int up = fcntl_dup(up_fd), cl = up < 0 ? -1 : fcntl_dup(cl_fd);
    if (up < 0 || cl < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        if (up >= 0) close(up);
        PyMem_Free(carry_buf);
        return NULL;
    }
    memset(r, 0, sizeof(*r));
    r->used = 1;
    r->gen = ++self->next_gen & 0xffffffffu;
    r->up = up;
    r->cl = cl;
    r->framing = framing;
    r->cstate = cstate;
    r->left = framing == F_CLOSE ? -1 : left;
    r->carry = carry_buf;
    memcpy(carry_buf, carry, (size_t)carry_len);
    r->carry_len = carry_len;
    r->out_chunked = out_chunked;
    r->xid = xid;
    r->last_up_ns = now_ns();
    self->count++;
    struct epoll_event ev = {.events = EPOLLRDHUP, .data.u64 = key_of(slot, r->gen, 1)};
    if (epoll_ctl(self->epfd, EPOLL_CTL_ADD, cl, &ev) < 0 || set_reading(self, slot, 1) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        release(self, slot);
        return NULL;
    }
    r->cl_events = EPOLLRDHUP;
    PyObject *handle = handle_of(slot, r->gen);
    if (handle == NULL) {
        release(self, slot);
        return NULL;
    }
    for (Py_ssize_t off = 0; off < early_len; off += READ_BYTES) {
        Py_ssize_t len = early_len - off < READ_BYTES ? early_len - off : READ_BYTES;
        memcpy(self->out + FRAME_HEAD, early + off, (size_t)len);
        int g = give(self, slot, self->out, len);
        if (g == -2) {
            Py_DECREF(handle);
            release(self, slot);
            return NULL;
        }
        if (g == -1) {
            if (report_text(self, self->done, slot, ST_CLIENT, "the client left mid-reply") < 0) {
                Py_DECREF(handle);
                return NULL;
            }
            break;
        }
    }
    return handle;
}

static PyObject *Pump_stop(Pump *self, PyObject *handle) {
    int slot;
    if (slot_of(self, handle, &slot) != NULL) release(self, slot);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* run() -> [(handle, status, message or None)]: serve every ready socket once. */
static PyObject *Pump_run(Pump *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *ended = self->done;
    self->done = PyList_New(0);
    if (self->done == NULL) {
        self->done = ended;
        return NULL;
    }
    if (!self->epfd_open) return ended;
    struct epoll_event evs[EVENTS];
    int n = epoll_wait(self->epfd, evs, EVENTS, 0);
    for (int i = 0; i < n; i++) {
        uint64_t key = evs[i].data.u64;
        int slot = (int)((uint32_t)key >> 1), client = (int)(key & 1);
        uint32_t gen = (uint32_t)(key >> 32);
        if (slot >= self->nslots || !self->slots[slot].used || self->slots[slot].gen != gen) continue;
        Relay *r = &self->slots[slot];
        int rc = 0;
        if (client) {
            uint32_t e = evs[i].events;
            if (e & EPOLLOUT) {
                int f = flush_pending(self, slot);
                if (f == -2) goto fail;
                if (f == -1) {
                    rc = report_text(self, ended, slot, ST_CLIENT, "the client left mid-reply");
                } else if (f == 1) {
                    if (r->ending) rc = report(self, ended, slot, r->end_status, NULL);
                    else if (set_reading(self, slot, 1) < 0)
                        rc = report_text(self, ended, slot, ST_UPSTREAM, "the upstream connection failed");
                    else
                        r->last_up_ns = now_ns();  /* the silence while the client caught up was ours */
                }
                if (rc < 0) goto fail;
                if (!r->used) continue;
            }
            if (e & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
                if (report_text(self, ended, slot, ST_CLIENT, "the client left mid-reply") < 0) goto fail;
            }
        } else if (r->reading) {
            if (pump_read(self, slot, ended) < 0) goto fail;
        }
    }
    return ended;
fail:
    Py_DECREF(ended);
    return NULL;
}

/* expire(now_ns, timeout_ns) -> ends, like run()'s: an upstream silent for the timeout while it
 * was read, and a client that took nothing of its unsent rest for as long. */
static PyObject *Pump_expire(Pump *self, PyObject *args) {
    long long now, timeout;
    if (!PyArg_ParseTuple(args, "LL:expire", &now, &timeout)) return NULL;
    PyObject *ended = PyList_New(0);
    if (ended == NULL) return NULL;
    for (int i = 0; i < self->nslots; i++) {
        Relay *r = &self->slots[i];
        if (!r->used) continue;
        int status = -1;
        if (r->pend_len && now - r->last_cl_ns >= timeout) status = ST_CLIENT_STALLED;
        else if (r->reading && now - r->last_up_ns >= timeout) status = ST_UPSTREAM_SILENT;
        if (status >= 0 && report(self, ended, i, status, NULL) < 0) {
            Py_DECREF(ended);
            return NULL;
        }
    }
    return ended;
}

/* stop_recording() -> [xid]: the recorded exchanges, whose pieces go to the feed no more. */
static PyObject *Pump_stop_recording(Pump *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *xids = PyList_New(0);
    if (xids == NULL) return NULL;
    for (int i = 0; i < self->nslots; i++) {
        Relay *r = &self->slots[i];
        if (!r->used || !r->xid) continue;
        PyObject *x = PyLong_FromLongLong(r->xid);
        if (x == NULL || PyList_Append(xids, x) < 0) {
            Py_XDECREF(x);
            Py_DECREF(xids);
            return NULL;
        }
        Py_DECREF(x);
        r->xid = 0;
    }
    return xids;
}

static PyObject *Pump_fileno(Pump *self, PyObject *Py_UNUSED(ignored)) { return PyLong_FromLong(self->epfd); }

static PyObject *Pump_get_count(Pump *self, void *c) { return PyLong_FromLong(self->count); }

static PyGetSetDef Pump_getset[] = {
    {"count", (getter)Pump_get_count, NULL, "exchanges being relayed", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Pump_methods[] = {
    {"start", (PyCFunction)Pump_start, METH_VARARGS,
     "start(upstream_fd, client_fd, framing, left, chunk_state, carry, out_chunked, xid, early) -> handle"},
    {"stop", (PyCFunction)Pump_stop, METH_O, "stop(handle): forget an exchange (no error if it ended)"},
    {"run", (PyCFunction)Pump_run, METH_NOARGS, "run() -> [(handle, status, message)]: serve what is ready"},
    {"expire", (PyCFunction)Pump_expire, METH_VARARGS, "expire(now_ns, timeout_ns) -> ends of silent or stalled exchanges"},
    {"stop_recording", (PyCFunction)Pump_stop_recording, METH_NOARGS,
     "stop_recording() -> [xid]: no more pieces of the exchanges being recorded go to the feed"},
    {"fileno", (PyCFunction)Pump_fileno, METH_NOARGS, "the epoll set's descriptor (readable when a socket is)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PumpType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "loadgen.capture._relay.Pump",
    .tp_basicsize = sizeof(Pump),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Pump(events, chunk_tag): the capture relay's body pump, in C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Pump_init,
    .tp_dealloc = (destructor)Pump_dealloc,
    .tp_methods = Pump_methods,
    .tp_getset = Pump_getset,
};

static struct PyModuleDef relay_module = {
    PyModuleDef_HEAD_INIT, "_relay", "The capture relay's compiled body pump.", -1, NULL,
};

PyMODINIT_FUNC PyInit__relay(void) {
    if (PyType_Ready(&PumpType) < 0) return NULL;
    PyObject *m = PyModule_Create(&relay_module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Pump", (PyObject *)&PumpType) < 0 ||
        PyModule_AddIntConstant(m, "F_LENGTH", F_LENGTH) < 0 ||
        PyModule_AddIntConstant(m, "F_CHUNKED", F_CHUNKED) < 0 ||
        PyModule_AddIntConstant(m, "F_CLOSE", F_CLOSE) < 0 ||
        PyModule_AddIntConstant(m, "ST_DONE", ST_DONE) < 0 ||
        PyModule_AddIntConstant(m, "ST_DONE_NO_REUSE", ST_DONE_NO_REUSE) < 0 ||
        PyModule_AddIntConstant(m, "ST_UPSTREAM", ST_UPSTREAM) < 0 ||
        PyModule_AddIntConstant(m, "ST_CLIENT", ST_CLIENT) < 0 ||
        PyModule_AddIntConstant(m, "ST_UPSTREAM_SILENT", ST_UPSTREAM_SILENT) < 0 ||
        PyModule_AddIntConstant(m, "ST_CLIENT_STALLED", ST_CLIENT_STALLED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
