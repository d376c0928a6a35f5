/* The compiled body reader: HTTP/1.1 body de-framing (chunked, Content-Length, close-delimited)
 * and SSE line splitting of a streamed reply, as the bytes of each read arrive.
 *
 * The reference is the Python path in loadgen/engine/http_reply.py (geventhttpclient's llhttp
 * parser feeding StampedResponse.take_lines): this module returns the same lines, byte for byte,
 * and fails the same inputs with the same kinds of error (the exception classes are given by the
 * caller, so this module imports nothing of the project). tests/unit/test_compiled_reader_diff.py
 * holds the two paths to that.
 *
 * Chunked framing follows llhttp's strict grammar as geventhttpclient runs it: hex sizes (at most
 * 16 digits' worth of value), ";name[=value]" extensions with token or quoted values, CRLF
 * everywhere (a bare LF is an error), trailer fields parsed as llhttp parses header fields, up to
 * the empty line. After the end of the message CR and LF are skipped (as llhttp does) and any other
 * byte is an error, as llhttp reads it as a response that no request asked for.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>  /* first: its pyconfig.h defines _GNU_SOURCE (memrchr) */
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "_reader_api.h"

enum { MODE_LENGTH = 0, MODE_CHUNKED = 1, MODE_CLOSE = 2 };

/* Chunked framing as llhttp's states name it (llhttp/src/llhttp/http.ts): the size line, its
 * extensions, the data and its CRLF, then the trailer section, parsed as llhttp parses header
 * fields, so that each input fails at the same byte with the same message on both paths. */
enum {
    CS_SIZE_START, CS_SIZE, CS_EXT_START, CS_EXT_NAME, CS_EXT_VALUE, CS_EXT_QUOTED,
    CS_EXT_QUOTED_ESC, CS_EXT_AFTER_QUOTED, CS_SIZE_LF, CS_DATA, CS_DATA_CR, CS_DATA_LF,
    CS_FIELD_START, CS_FIELD_NAME, CS_VALUE_WS, CS_VALUE_WS_LF, CS_VALUE_LWS, CS_VALUE, CS_VALUE_LF,
    CS_VALUE_FOLD, CS_END_LF, CS_DONE
};

#define NAME_KEPT 20  /* enough for the longest header name llhttp treats apart */

typedef struct {
    PyObject_HEAD
    int mode;
    int cstate;
    uint64_t remaining;      /* Content-Length bytes left, or the current chunk's bytes left */
    char *buf;               /* de-framed body bytes not yet returned as lines */
    Py_ssize_t len, cap;
    Py_ssize_t scan_from;    /* bytes of buf already searched for a LF (LF mode) */
    Py_ssize_t max_line;
    int any_eol;             /* a lone CR was seen: lines end at CR, LF or CRLF from now on */
    int at_start;            /* no line returned yet: a leading UTF-8 BOM is dropped */
    int ended_mid_line;
    int complete;
    char name[NAME_KEPT];    /* the trailer field name so far, lowercased (first NAME_KEPT bytes) */
    Py_ssize_t name_len;
    PyObject *parse_error;   /* raised for broken framing (the Python path's HTTPParseError) */
    PyObject *line_error;    /* raised for a line over max_line (the Python path's BadBody) */
} BodyReader;

static int is_tchar(unsigned char c) {
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return 1;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* qdtext of a quoted extension value: HTAB, SP, 0x21, 0x23-0x5B, 0x5D-0x7E, obs-text */
static int is_qdtext(unsigned char c) {
    return c == '\t' || c == ' ' || c == 0x21 || (c >= 0x23 && c <= 0x5b) || (c >= 0x5d && c <= 0x7e) || c >= 0x80;
}

/* what may follow a backslash in a quoted value, and the bytes of a header value: HTAB, SP, VCHAR, obs-text */
static int is_vchar_ws(unsigned char c) {
    return c == '\t' || (c >= 0x20 && c <= 0x7e) || c >= 0x80;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The trailer field name is one llhttp gives a state of its own (its SPECIAL_HEADERS). */
static int name_is(BodyReader *self, const char *lower) {
    Py_ssize_t n = (Py_ssize_t)strlen(lower);
    return self->name_len == n && memcmp(self->name, lower, (size_t)n) == 0;
}

static int name_is_special(BodyReader *self) {
    return name_is(self, "connection") || name_is(self, "content-length") || name_is(self, "proxy-connection") ||
           name_is(self, "transfer-encoding") || name_is(self, "upgrade");
}

static int buf_append(BodyReader *self, const char *p, Py_ssize_t n) {
    if (n <= 0) return 0;
    if (self->len + n > self->cap) {
        Py_ssize_t cap = self->cap ? self->cap : 4096;
        while (cap < self->len + n) cap *= 2;
        char *nb = PyMem_Realloc(self->buf, cap);
        if (nb == NULL) { PyErr_NoMemory(); return -1; }
        self->buf = nb;
        self->cap = cap;
    }
    memcpy(self->buf + self->len, p, n);
    self->len += n;
    return 0;
}

static void buf_consume(BodyReader *self, Py_ssize_t n) {
    if (n >= self->len) { self->len = 0; return; }
    memmove(self->buf, self->buf + n, self->len - n);
    self->len -= n;
}

static PyObject *fail(BodyReader *self, const char *msg) {
    PyErr_SetString(self->parse_error, msg);
    return NULL;
}

#define FAIL(msg) do { fail(self, msg); return -1; } while (0)

/* Bytes after the end of a response: llhttp skips CR and LF there, and reads anything else as a
 * response no request asked for. */
static int after_the_end(BodyReader *self, const unsigned char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] != '\r' && p[i] != '\n') FAIL("data after the end of the response");
    return 0;
}

/* De-frame one read's bytes into buf. A state that llhttp leaves without consuming the byte
 * ("peek" / "otherwise") sets the next state and `continue`s without i++. */
static int feed_chunked(BodyReader *self, const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        switch (self->cstate) {
        case CS_SIZE_START: {
            int h = hexval(c);
            if (h < 0) FAIL("Invalid character in chunk size");
            self->remaining = (uint64_t)h;
            self->cstate = CS_SIZE;
            break;
        }
        case CS_SIZE: {
            int h = hexval(c);
            if (h >= 0) {
                if (self->remaining > (UINT64_MAX >> 4)) FAIL("Chunk size overflow");
                self->remaining = (self->remaining << 4) | (uint64_t)h;
            } else if (c == ';') {
                self->cstate = CS_EXT_START;
            } else if (c == '\r') {
                self->cstate = CS_SIZE_LF;
            } else if (c == '\n') {
                FAIL("Missing expected CR after chunk size");
            } else {
                FAIL("Invalid character in chunk size");
            }
            break;
        }
        case CS_EXT_START:  /* after a ';': a name (possibly empty) follows */
            if (c == ' ' || c == '\r') FAIL("Invalid character in chunk extensions");
            self->cstate = CS_EXT_NAME;
            continue;
        case CS_EXT_NAME:
            if (is_tchar(c)) { /* the name goes on */ }
            else if (c == '=') self->cstate = CS_EXT_VALUE;
            else if (c == ';') self->cstate = CS_EXT_START;
            else if (c == '\r') self->cstate = CS_SIZE_LF;
            else if (c == '\n') FAIL("Missing expected CR after chunk extension name");
            else FAIL("Invalid character in chunk extensions name");
            break;
        case CS_EXT_VALUE:  /* a token, possibly empty; a '"' anywhere in it opens a quoted part */
            if (c == '"') self->cstate = CS_EXT_QUOTED;
            else if (is_tchar(c)) { /* the value goes on */ }
            else if (c == ';') self->cstate = CS_EXT_START;
            else if (c == '\r') self->cstate = CS_SIZE_LF;
            else if (c == '\n') FAIL("Missing expected CR after chunk extension value");
            else FAIL("Invalid character in chunk extensions value");
            break;
        case CS_EXT_QUOTED:
            if (c == '"') self->cstate = CS_EXT_AFTER_QUOTED;
            else if (c == '\\') self->cstate = CS_EXT_QUOTED_ESC;
            else if (!is_qdtext(c)) FAIL("Invalid character in chunk extensions quoted value");
            break;
        case CS_EXT_QUOTED_ESC:
            if (!is_vchar_ws(c)) FAIL("Invalid quoted-pair in chunk extensions quoted value");
            self->cstate = CS_EXT_QUOTED;
            break;
        case CS_EXT_AFTER_QUOTED:
            if (c == ';') self->cstate = CS_EXT_START;
            else if (c == '\r') self->cstate = CS_SIZE_LF;
            else if (c == '\n') FAIL("Missing expected CR after chunk extension value");
            else FAIL("Invalid character in chunk extensions quote value");
            break;
        case CS_SIZE_LF:
            if (c != '\n') FAIL("Expected LF after chunk size");
            self->cstate = self->remaining ? CS_DATA : CS_FIELD_START;
            break;
        case CS_DATA: {
            Py_ssize_t take = n - i;
            if ((uint64_t)take > self->remaining) take = (Py_ssize_t)self->remaining;
            if (buf_append(self, (const char *)p + i, take) < 0) return -1;
            self->remaining -= (uint64_t)take;
            i += take;
            if (self->remaining == 0) self->cstate = CS_DATA_CR;
            continue;
        }
        case CS_DATA_CR:
            if (c == '\n') FAIL("Missing expected CR after chunk data");
            if (c != '\r') FAIL("Expected LF after chunk data");
            self->cstate = CS_DATA_LF;
            break;
        case CS_DATA_LF:
            if (c != '\n') FAIL("Expected LF after chunk data");
            self->cstate = CS_SIZE_START;
            break;
        /* The trailer section: header fields up to an empty line. */
        case CS_FIELD_START:
            if (c == '\r') { self->cstate = CS_END_LF; break; }
            if (c == '\n') FAIL("Invalid header field char");
            if (c == ':') FAIL("Invalid header token");
            self->name_len = 0;
            self->cstate = CS_FIELD_NAME;
            continue;
        case CS_FIELD_NAME:
            if (is_tchar(c)) {
                if (self->name_len < NAME_KEPT)
                    self->name[self->name_len] = (char)((c >= 'A' && c <= 'Z') ? c + 32 : c);
                self->name_len++;
            } else if (c == ':') {
                /* The head said Transfer-Encoding: a Content-Length beside it is an error. */
                if (name_is(self, "content-length")) FAIL("Content-Length can't be present with Transfer-Encoding");
                self->cstate = CS_VALUE_WS;
            } else if (c == ' ' && name_is_special(self)) {
                FAIL("Invalid header field char");
            } else {
                FAIL("Invalid header token");
            }
            break;
        case CS_VALUE_WS:  /* the whitespace before a value */
            if (c == ' ' || c == '\t') break;
            if (c == '\r') { self->cstate = CS_VALUE_WS_LF; break; }
            if (c == '\n') FAIL("Invalid header value char");
            self->cstate = CS_VALUE;
            continue;
        case CS_VALUE_WS_LF:  /* an empty value's CR */
            if (c != '\n') FAIL("Expected LF after CR");
            self->cstate = CS_VALUE_LWS;
            break;
        case CS_VALUE_LWS:  /* after an empty value's line: no folding */
            if (c == ' ' || c == '\t') FAIL("Invalid header value char");
            self->cstate = CS_FIELD_START;
            continue;
        case CS_VALUE:
            if (c == '\r') self->cstate = CS_VALUE_LF;
            else if (c == '\n') FAIL("Missing expected CR after header value");
            else if (!is_vchar_ws(c)) FAIL("Invalid header value char");
            break;
        case CS_VALUE_LF:
            if (c != '\n') FAIL("Missing expected LF after header value");
            self->cstate = CS_VALUE_FOLD;
            break;
        case CS_VALUE_FOLD:  /* after a value's line: no folding */
            if (c == ' ' || c == '\t') FAIL("Unexpected whitespace after header value");
            self->cstate = CS_FIELD_START;
            continue;
        case CS_END_LF:
            if (c != '\n') FAIL("Expected LF after headers");
            self->cstate = CS_DONE;
            self->complete = 1;
            break;
        case CS_DONE:
            return after_the_end(self, p + i, n - i);
        }
        i++;
    }
    return 0;
}

/* De-frame one read's bytes (n == 0: the peer closed): 0, or -1 with the error set. */
static int feed_bytes(BodyReader *self, const unsigned char *p, Py_ssize_t n) {
    if (n == 0) {
        /* The peer closed: that ends a close-delimited body and breaks any other. */
        if (self->mode == MODE_CLOSE) { self->complete = 1; return 0; }
        if (!self->complete) { fail(self, "connection closed mid-body"); return -1; }
        return 0;
    }
    if (self->complete) return after_the_end(self, p, n);
    if (self->mode == MODE_CHUNKED) return feed_chunked(self, p, n);
    if (self->mode == MODE_LENGTH) {
        Py_ssize_t take = n;
        if ((uint64_t)take > self->remaining) take = (Py_ssize_t)self->remaining;
        int rc = buf_append(self, (const char *)p, take);
        self->remaining -= (uint64_t)take;
        if (rc == 0 && self->remaining == 0) self->complete = 1;
        if (rc == 0 && take < n) rc = after_the_end(self, p + take, n - take);
        return rc;
    }
    return buf_append(self, (const char *)p, n);
}

static PyObject *BodyReader_feed(BodyReader *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    int rc = feed_bytes(self, view.buf, view.len);
    PyBuffer_Release(&view);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* ---- line splitting: StampedResponse.take_lines and _take_lines_any, ported ---------------- */

/* Each line goes to a sink: a list (take_lines) or a C callback (the raw path, _reader_api.h).
 * The first line of the body loses a leading UTF-8 BOM. */
typedef struct {
    reader_line_fn fn;
    void *ctx;
} Sink;

static int emit(BodyReader *self, Sink *sink, const char *s, Py_ssize_t n) {
    if (self->at_start) {
        self->at_start = 0;
        if (n >= 3 && memcmp(s, "\xef\xbb\xbf", 3) == 0) { s += 3; n -= 3; }
    }
    return sink->fn(sink->ctx, s, n);
}

static int last_line(BodyReader *self, Sink *sink) {
    /* The body is complete: what is left is its last line (no line end), or nothing. */
    if (self->len == 0) return READ_END;
    self->ended_mid_line = 1;
    if (emit(self, sink, self->buf, self->len) < 0) return -1;
    self->len = 0;
    self->scan_from = 0;
    return READ_LINES;
}

static int too_long(BodyReader *self) {
    PyErr_Format(self->line_error, "a stream line longer than %zd bytes", self->max_line);
    return -1;
}

static int take_any(BodyReader *self, Sink *sink) {
    const char *b = self->buf;
    Py_ssize_t n = self->len;
    Py_ssize_t i = -1;
    for (Py_ssize_t k = n - 1; k >= 0; k--) if (b[k] == '\n' || b[k] == '\r') { i = k; break; }
    if (i >= 0 && i == n - 1 && b[i] == '\r' && !self->complete) {
        /* A CR as the last byte so far may be half of a CRLF: it ends its line later. */
        Py_ssize_t j = -1;
        for (Py_ssize_t k = i - 1; k >= 0; k--) if (b[k] == '\n' || b[k] == '\r') { j = k; break; }
        i = j;
    }
    if (i >= 0) {
        Py_ssize_t start = 0, k = 0, end = i + 1;
        while (k < end) {
            char c = b[k];
            if (c == '\r' || c == '\n') {
                if (emit(self, sink, b + start, k - start) < 0) return -1;
                k += (c == '\r' && k + 1 < end && b[k + 1] == '\n') ? 2 : 1;
                start = k;
            } else {
                k++;
            }
        }
        buf_consume(self, end);
        self->scan_from = 0;
        return READ_LINES;
    }
    if (self->complete) return last_line(self, sink);
    if (n > self->max_line) return too_long(self);
    return READ_MORE;
}

/* The complete lines now buffered, each to the sink: READ_LINES; READ_END once the body is
 * complete and nothing is left; READ_MORE when more data is needed; -1 with an error set. */
static int take_lines_into(BodyReader *self, Sink *sink) {
    if (self->any_eol) return take_any(self, sink);
    const char *b = self->buf;
    Py_ssize_t n = self->len;
    Py_ssize_t from = self->scan_from < n ? self->scan_from : n;
    const char *lf = n > from ? memrchr(b + from, '\n', (size_t)(n - from)) : NULL;
    Py_ssize_t i = lf == NULL ? -1 : lf - b;
    if (i >= 0) {
        /* A CR in the block is a CRLF's, unless some CR has no LF after it. */
        const char *first_cr = memchr(b, '\r', (size_t)i);
        if (first_cr != NULL) {
            Py_ssize_t cr = 0, crlf = 0;
            for (Py_ssize_t k = first_cr - b; k < i; k++) {
                if (b[k] == '\r') {
                    cr++;
                    if (k + 1 < i && b[k + 1] == '\n') crlf++;
                }
            }
            if (cr != crlf + (b[i - 1] == '\r')) {
                self->any_eol = 1;
                return take_any(self, sink);
            }
        }
        Py_ssize_t start = 0;
        const char *next;
        while (start < i && (next = memchr(b + start, '\n', (size_t)(i - start))) != NULL) {
            Py_ssize_t k = next - b;
            if (emit(self, sink, b + start, k - start) < 0) return -1;
            start = k + 1;
        }
        if (emit(self, sink, b + start, i - start) < 0) return -1;
        buf_consume(self, i + 1);
        self->scan_from = 0;
        return READ_LINES;
    }
    /* No LF: a CR with a byte after it (or at the body's end) ends a line of its own. */
    Py_ssize_t j0 = self->scan_from > 0 ? self->scan_from - 1 : 0;
    for (Py_ssize_t j = j0; j < n; j++) {
        if (b[j] == '\r') {
            if (j + 1 < n || self->complete) {
                self->any_eol = 1;
                return take_any(self, sink);
            }
            break;
        }
    }
    if (self->complete) return last_line(self, sink);
    if (n > self->max_line) return too_long(self);
    self->scan_from = n;
    return READ_MORE;
}

static int push_to_list(void *list, const char *s, Py_ssize_t n) {
    PyObject *line = PyBytes_FromStringAndSize(s, n);
    if (line == NULL) return -1;
    int rc = PyList_Append((PyObject *)list, line);
    Py_DECREF(line);
    return rc;
}

static PyObject *BodyReader_take_lines(BodyReader *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *lines = PyList_New(0);
    if (lines == NULL) return NULL;
    Sink sink = {push_to_list, lines};
    int rc = take_lines_into(self, &sink);
    if (rc < 0 || rc == READ_MORE) {
        Py_DECREF(lines);
        if (rc < 0) return NULL;
        Py_RETURN_NONE;
    }
    return lines;
}

static PyObject *BodyReader_take_body(BodyReader *self, PyObject *arg) {
    Py_ssize_t limit = PyLong_AsSsize_t(arg);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    if (limit < 0) limit = 0;
    PyObject *out = PyBytes_FromStringAndSize(self->buf, self->len < limit ? self->len : limit);
    if (out == NULL) return NULL;
    self->len = 0;
    self->scan_from = 0;
    return out;
}

static PyObject *BodyReader_pending(BodyReader *self, PyObject *arg) {
    Py_ssize_t limit = PyLong_AsSsize_t(arg);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    if (limit < 0) limit = 0;
    return PyBytes_FromStringAndSize(self->buf, self->len < limit ? self->len : limit);
}

static int BodyReader_init(BodyReader *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"mode", "length", "max_line_bytes", "parse_error", "line_error", NULL};
    int mode;
    unsigned long long length;
    Py_ssize_t max_line;
    PyObject *perr, *lerr;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iKnOO", kwlist, &mode, &length, &max_line, &perr, &lerr))
        return -1;
    if (mode < MODE_LENGTH || mode > MODE_CLOSE) {
        PyErr_SetString(PyExc_ValueError, "mode is 0 (Content-Length), 1 (chunked) or 2 (close-delimited)");
        return -1;
    }
    self->mode = mode;
    self->cstate = CS_SIZE_START;
    self->remaining = mode == MODE_LENGTH ? length : 0;
    self->max_line = max_line;
    self->len = 0;
    self->scan_from = 0;
    self->any_eol = 0;
    self->at_start = 1;
    self->ended_mid_line = 0;
    self->complete = mode == MODE_LENGTH && length == 0;
    Py_XSETREF(self->parse_error, Py_NewRef(perr));
    Py_XSETREF(self->line_error, Py_NewRef(lerr));
    return 0;
}

static void BodyReader_dealloc(BodyReader *self) {
    PyMem_Free(self->buf);
    Py_XDECREF(self->parse_error);
    Py_XDECREF(self->line_error);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *BodyReader_get_complete(BodyReader *self, void *c) { return PyBool_FromLong(self->complete); }
static PyObject *BodyReader_get_ended(BodyReader *self, void *c) { return PyBool_FromLong(self->ended_mid_line); }
static PyObject *BodyReader_get_buffered(BodyReader *self, void *c) { return PyLong_FromSsize_t(self->len); }

static PyGetSetDef BodyReader_getset[] = {
    {"complete", (getter)BodyReader_get_complete, NULL, "the body's last byte has been read", NULL},
    {"ended_mid_line", (getter)BodyReader_get_ended, NULL, "the body ended with a line that has no line end", NULL},
    {"buffered", (getter)BodyReader_get_buffered, NULL, "body bytes held, not yet returned", NULL},
    {NULL}
};

static PyMethodDef BodyReader_methods[] = {
    {"feed", (PyCFunction)BodyReader_feed, METH_O,
     "feed(data): de-frame one read's bytes (b\"\": the peer closed)."},
    {"take_lines", (PyCFunction)BodyReader_take_lines, METH_NOARGS,
     "take_lines() -> list[bytes] | None: the complete lines now buffered, [] once the body is "
     "complete, None when more data is needed (StampedResponse.take_lines)."},
    {"take_body", (PyCFunction)BodyReader_take_body, METH_O,
     "take_body(limit) -> bytes: the buffered body, up to limit bytes, and forget it."},
    {"pending", (PyCFunction)BodyReader_pending, METH_O,
     "pending(limit) -> bytes: the first limit buffered bytes, kept."},
    {NULL}
};

static PyTypeObject BodyReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "loadgen.engine._reader.BodyReader",
    .tp_doc = "BodyReader(mode, length, max_line_bytes, parse_error, line_error): one reply body, "
              "de-framed and split into SSE lines as its reads arrive.",
    .tp_basicsize = sizeof(BodyReader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)BodyReader_init,
    .tp_dealloc = (destructor)BodyReader_dealloc,
    .tp_methods = BodyReader_methods,
    .tp_getset = BodyReader_getset,
};

static long long clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* recv_stamped(fd, size) -> (data, t_ns): one non-blocking recvmsg of up to size bytes, and when
 * they arrived: the kernel's receive stamp (SO_TIMESTAMPNS, CLOCK_REALTIME) moved onto
 * CLOCK_MONOTONIC (time.perf_counter_ns's clock here) with the offset read now, or now where
 * there is no stamp or it is later than now. The same as http_reply.arrival_ns on recvmsg's
 * ancillary data, without the tuple, the list and the struct unpack per read. OSError (its
 * errno's subclass: BlockingIOError when nothing is there) as socket.recvmsg raises. */
/* One stamped read of fd: the data (a new bytes, b"" at the peer's end) with *t_out set to its
 * arrival as a new int, or NULL with OSError set. */
/* One stamped read of fd into buf: the bytes read (0 at the peer's end) with *t set to their
 * arrival, or -1 with errno set. */
static ssize_t read_stamped_into(int fd, char *buf, Py_ssize_t size, long long *t) {
    union {
        char buf[CMSG_SPACE(sizeof(struct timespec))];
        struct cmsghdr align;
    } control;
    struct iovec iov = {buf, (size_t)size};
    struct msghdr msg;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof(control.buf);
    ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT);
    if (n < 0) return -1;
    long long now = clock_ns(CLOCK_MONOTONIC);
    *t = now;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS &&
            c->cmsg_len >= CMSG_LEN(sizeof(struct timespec))) {
            struct timespec ts;
            memcpy(&ts, CMSG_DATA(c), sizeof(ts));
            long long offset = clock_ns(CLOCK_REALTIME) - clock_ns(CLOCK_MONOTONIC);
            long long stamped = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec - offset;
            if (stamped <= now) *t = stamped;
            break;
        }
    }
    return n;
}

/* One stamped read of fd: the data (a new bytes, b"" at the peer's end) with *t_out set to its
 * arrival as a new int, or NULL with OSError set. */
static PyObject *stamped_read(int fd, Py_ssize_t size, PyObject **t_out) {
    PyObject *data = PyBytes_FromStringAndSize(NULL, size);
    if (data == NULL) return NULL;
    long long t;
    ssize_t n = read_stamped_into(fd, PyBytes_AS_STRING(data), size, &t);
    if (n < 0) {
        Py_DECREF(data);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (n != size && _PyBytes_Resize(&data, n) < 0) return NULL;
    *t_out = PyLong_FromLongLong(t);
    if (*t_out == NULL) {
        Py_DECREF(data);
        return NULL;
    }
    return data;
}

static PyObject *recv_stamped(PyObject *mod, PyObject *args) {
    int fd;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "in:recv_stamped", &fd, &size)) return NULL;
    if (size <= 0) {
        PyErr_SetString(PyExc_ValueError, "recv_stamped: size must be positive");
        return NULL;
    }
    PyObject *t = NULL;
    PyObject *data = stamped_read(fd, size, &t);
    if (data == NULL) return NULL;
    return Py_BuildValue("(NN)", data, t);
}

/* ---- Poller: the stream reader's loop (stream_reader.py's StreamReader._run) in one C call ----
 *
 * One epoll set of the sockets whose reply bodies are being read. poll(budget_ns) takes the ready
 * sockets from the kernel and, for each, does the read of recv_stamped and hands (data, t_ns) to
 * that socket's consume callback (a ChatTaker's bound consume in C, or any Python callable), with
 * no Python frame, dict look-up or tuple between them. A socket leaves the set when its consume
 * says its stream ended, raises, or its read fails or finds the peer gone; those are returned, for
 * Python to wake each stream's greenlet. The table is indexed by fd and each registration has a
 * generation, so an event of a socket that left (and whose number came back) is skipped. The
 * Python loop in stream_reader.py is the reference: tests/integration/test_stream_reader.py runs
 * its tests on both. */

typedef struct {
    PyObject *consume;    /* NULL: the slot is free */
    PyObject *raw;        /* a raw consumer's capsule (_reader_api.h), or NULL */
    raw_consume_fn raw_fn;
    void *raw_ctx;
    Py_ssize_t block_size;
    uint32_t gen;
} PollSlot;

typedef struct {
    PyObject_HEAD
    int epfd;
    int epfd_open;        /* tp_new zeroes the struct: 0 is a descriptor too */
    PollSlot *slots;
    int nslots;
    int count;
    uint32_t next_gen;
    PyObject *carried;    /* the ends a poll had taken when a BaseException cut it: the next one's */
    char *rbuf;           /* the raw consumers' reads land here, one at a time */
    Py_ssize_t rcap;
} Poller;

static void poller_forget(Poller *self, int fd) {
    if (fd < 0 || fd >= self->nslots || self->slots[fd].consume == NULL) return;
    epoll_ctl(self->epfd, EPOLL_CTL_DEL, fd, NULL);  /* fails harmlessly for a closed socket */
    Py_CLEAR(self->slots[fd].consume);
    Py_CLEAR(self->slots[fd].raw);
    self->count--;
}

static int Poller_init(Poller *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, ":Poller", kwlist)) return -1;
    if (self->epfd_open) return 0;  /* __init__ again: keep the set */
    self->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (self->epfd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->epfd_open = 1;
    return 0;
}

static void Poller_dealloc(Poller *self) {
    for (int fd = 0; fd < self->nslots; fd++) {
        Py_CLEAR(self->slots[fd].consume);
        Py_CLEAR(self->slots[fd].raw);
    }
    PyMem_Free(self->slots);
    PyMem_Free(self->rbuf);
    Py_XDECREF(self->carried);
    if (self->epfd_open) close(self->epfd);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* add(fd, block_size, consume, raw=None): read fd into consume(data, t_ns) from the next poll
 * on; with raw (a raw consumer's capsule, _reader_api.h) each read goes to it instead, from a
 * buffer of the poller's, and consume is only kept. */
static PyObject *Poller_add(Poller *self, PyObject *args) {
    int fd;
    Py_ssize_t block_size;
    PyObject *consume, *raw = Py_None;
    if (!PyArg_ParseTuple(args, "inO|O:add", &fd, &block_size, &consume, &raw)) return NULL;
    RawConsumer *rc = NULL;
    void *raw_ctx = NULL;
    if (raw != Py_None) {
        rc = PyCapsule_GetPointer(raw, RAW_CONSUMER_CAPSULE);
        if (rc == NULL) return NULL;
        raw_ctx = PyCapsule_GetContext(raw);
        if (raw_ctx == NULL && PyErr_Occurred()) return NULL;
    }
    if (!self->epfd_open) {
        PyErr_SetString(PyExc_ValueError, "Poller: not initialised");
        return NULL;
    }
    if (fd < 0 || block_size <= 0 || !PyCallable_Check(consume)) {
        PyErr_SetString(PyExc_ValueError, "add(fd >= 0, block_size > 0, consume: callable)");
        return NULL;
    }
    if (fd >= self->nslots) {
        int n = self->nslots ? self->nslots : 256;
        while (n <= fd) n *= 2;
        PollSlot *s = PyMem_Realloc(self->slots, (size_t)n * sizeof(PollSlot));
        if (s == NULL) return PyErr_NoMemory();
        memset(s + self->nslots, 0, (size_t)(n - self->nslots) * sizeof(PollSlot));
        self->slots = s;
        self->nslots = n;
    }
    if (rc != NULL && block_size > self->rcap) {
        char *b = PyMem_Realloc(self->rbuf, (size_t)block_size);
        if (b == NULL) return PyErr_NoMemory();
        self->rbuf = b;
        self->rcap = block_size;
    }
    poller_forget(self, fd);  /* a closed socket's number, reused before it left the set */
    uint32_t gen = ++self->next_gen;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = ((uint64_t)gen << 32) | (uint32_t)fd};
    if (epoll_ctl(self->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        if (errno != EEXIST || epoll_ctl(self->epfd, EPOLL_CTL_MOD, fd, &ev) < 0)
            return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_INCREF(consume);
    self->slots[fd].consume = consume;
    if (rc != NULL) {
        Py_INCREF(raw);
        self->slots[fd].raw = raw;
        self->slots[fd].raw_fn = rc->fn;
        self->slots[fd].raw_ctx = raw_ctx;
    }
    self->slots[fd].block_size = block_size;
    self->slots[fd].gen = gen;
    self->count++;
    Py_RETURN_NONE;
}

static PyObject *Poller_remove(Poller *self, PyObject *arg) {
    int fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred()) return NULL;
    poller_forget(self, fd);
    Py_RETURN_NONE;
}

static int poller_ended(Poller *self, PyObject *ended, int fd, PyObject *error) {
    poller_forget(self, fd);
    PyObject *item = Py_BuildValue("(iO)", fd, error ? error : Py_None);
    if (item == NULL) return -1;
    int r = PyList_Append(ended, item);
    Py_DECREF(item);
    return r;
}

/* The exception raised now, if it is an Exception (it ends its stream), taken off the error
 * indicator; NULL (with the error still set) for a BaseException that must propagate. */
static PyObject *take_exception(void) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL) PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
}

#define POLL_EVENTS 256

/* poll(budget_ns) -> (reads, ended): reads done (0: nothing was ready), and [(fd, error or None)]
 * of the streams that ended. Stops taking ready sockets once budget_ns have passed (the rest stay
 * ready: the set is level-triggered and their data keeps its kernel stamp). */
static PyObject *Poller_poll(Poller *self, PyObject *arg) {
    long long budget = PyLong_AsLongLong(arg);
    if (budget == -1 && PyErr_Occurred()) return NULL;
    PyObject *ended = self->carried != NULL ? self->carried : PyList_New(0);
    self->carried = NULL;
    if (ended == NULL) return NULL;
    struct epoll_event events[POLL_EVENTS];
    long long start = clock_ns(CLOCK_MONOTONIC);
    long reads = 0;
    int over = 0;
    while (!over && self->count > 0) {
        int n = epoll_wait(self->epfd, events, POLL_EVENTS, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            Py_DECREF(ended);
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        if (n == 0) break;
        for (int i = 0; i < n; i++) {
            int fd = (int)(uint32_t)events[i].data.u64;
            uint32_t gen = (uint32_t)(events[i].data.u64 >> 32);
            if (fd >= self->nslots || self->slots[fd].consume == NULL || self->slots[fd].gen != gen) continue;
            PyObject *consume = self->slots[fd].consume;
            Py_INCREF(consume);  /* consume may end its own stream's following */
            PyObject *t_obj = NULL, *data = NULL, *error = NULL;
            int end = 0;
            if (self->slots[fd].raw != NULL) {
                /* the raw path: the read into the poller's buffer, straight to the consumer */
                PyObject *raw = self->slots[fd].raw;
                Py_INCREF(raw);
                long long t;
                ssize_t got = read_stamped_into(fd, self->rbuf, self->slots[fd].block_size, &t);
                if (got < 0) {
                    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                        Py_DECREF(raw);
                        Py_DECREF(consume);
                        continue;
                    }
                    PyErr_SetFromErrno(PyExc_OSError);
                    error = take_exception();
                    end = 1;
                } else {
                    reads++;
                    int last = self->slots[fd].raw_fn(self->slots[fd].raw_ctx, self->rbuf, got, t);
                    if (last < 0) { error = take_exception(); last = 1; }
                    end = last || got == 0;
                }
                Py_DECREF(raw);
            } else if ((data = stamped_read(fd, self->slots[fd].block_size, &t_obj)) == NULL) {
                if (PyErr_ExceptionMatches(PyExc_BlockingIOError) || PyErr_ExceptionMatches(PyExc_InterruptedError)) {
                    PyErr_Clear();
                    Py_DECREF(consume);
                    continue;
                }
                error = take_exception();
                end = 1;
            } else {
                reads++;
                PyObject *cargs[2] = {data, t_obj};
                PyObject *done = PyObject_Vectorcall(consume, cargs, 2, NULL);
                if (done == NULL) {
                    error = take_exception();
                    end = 1;
                } else {
                    int last = PyObject_IsTrue(done);
                    Py_DECREF(done);
                    if (last < 0) { error = take_exception(); last = 1; }
                    /* at the socket's end nothing more can come, said or not */
                    end = last || PyBytes_GET_SIZE(data) == 0;
                }
            }
            Py_XDECREF(data);
            Py_XDECREF(t_obj);
            Py_DECREF(consume);
            if (end && error == NULL && PyErr_Occurred()) {  /* a BaseException: the caller's */
                poller_forget(self, fd);
                self->carried = ended;  /* the streams that ended before it still must hear so */
                return NULL;
            }
            if (end) {
                int r = poller_ended(self, ended, fd, error);
                Py_XDECREF(error);
                if (r < 0) { Py_DECREF(ended); return NULL; }
            }
            if (clock_ns(CLOCK_MONOTONIC) - start >= budget) { over = 1; break; }
        }
        if (n < POLL_EVENTS && !over) break;  /* all that was ready has been read */
    }
    return Py_BuildValue("(lN)", reads, ended);
}

static PyObject *Poller_fileno(Poller *self, PyObject *Py_UNUSED(ignored)) { return PyLong_FromLong(self->epfd); }

static PyObject *Poller_get_count(Poller *self, void *c) { return PyLong_FromLong(self->count); }

static PyGetSetDef Poller_getset[] = {
    {"count", (getter)Poller_get_count, NULL, "sockets in the set", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Poller_methods[] = {
    {"add", (PyCFunction)Poller_add, METH_VARARGS,
     "add(fd, block_size, consume, raw=None): follow fd's reads into consume(data, t_ns), or into the raw "
     "consumer raw (a capsule, _reader_api.h) without a Python object per read"},
    {"remove", (PyCFunction)Poller_remove, METH_O, "remove(fd): stop following fd (no error if it is not followed)"},
    {"poll", (PyCFunction)Poller_poll, METH_O, "poll(budget_ns) -> (reads, [(fd, error or None)]): read every ready socket"},
    {"fileno", (PyCFunction)Poller_fileno, METH_NOARGS, "the epoll set's descriptor (readable when a socket is)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PollerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "loadgen.engine._reader.Poller",
    .tp_basicsize = sizeof(Poller),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Poller(): the stream reader's epoll set and its read loop, in C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Poller_init,
    .tp_dealloc = (destructor)Poller_dealloc,
    .tp_methods = Poller_methods,
    .tp_getset = Poller_getset,
};

static PyMethodDef reader_functions[] = {
    {"recv_stamped", recv_stamped, METH_VARARGS,
     "recv_stamped(fd, size) -> (data, t_ns): a non-blocking recvmsg and its kernel receive stamp on "
     "the perf_counter clock (now where there is none)."},
    {NULL, NULL, 0, NULL},
};

/* ---- the C API (_reader_api.h) ---- */

static int api_feed(PyObject *reader, const char *p, Py_ssize_t n) {
    return feed_bytes((BodyReader *)reader, (const unsigned char *)p, n);
}

static int api_take_lines(PyObject *reader, reader_line_fn fn, void *ctx) {
    Sink sink = {fn, ctx};
    return take_lines_into((BodyReader *)reader, &sink);
}

static int api_complete(PyObject *reader) { return ((BodyReader *)reader)->complete; }

static ReaderAPI reader_api = {
    READER_API_VERSION, &BodyReaderType, api_feed, api_take_lines, api_complete,
};

static struct PyModuleDef reader_module = {
    PyModuleDef_HEAD_INIT, "_reader",
    "The compiled body reader (chunked/identity/close-delimited de-framing, SSE line splitting).",
    -1, reader_functions,
};

PyMODINIT_FUNC PyInit__reader(void) {
    if (PyType_Ready(&BodyReaderType) < 0 || PyType_Ready(&PollerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&reader_module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "BodyReader", (PyObject *)&BodyReaderType) < 0 ||
        PyModule_AddObjectRef(m, "Poller", (PyObject *)&PollerType) < 0 ||
        PyModule_AddIntConstant(m, "MODE_LENGTH", MODE_LENGTH) < 0 ||
        PyModule_AddIntConstant(m, "MODE_CHUNKED", MODE_CHUNKED) < 0 ||
        PyModule_AddIntConstant(m, "MODE_CLOSE", MODE_CLOSE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *api = PyCapsule_New(&reader_api, READER_API_CAPSULE, NULL);
    if (api == NULL || PyModule_AddObjectRef(m, "_C_API", api) < 0) {
        Py_XDECREF(api);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(api);
    return m;
}
