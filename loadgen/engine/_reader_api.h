/* What loadgen/engine/_reader.c offers other compiled modules (loadgen/engine/_chat.c): its body
 * reader's feed and line splitting as C calls, through the capsule _reader._C_API, and the shape of
 * a raw consumer: a callback that the Poller hands each read's bytes and stamp as they are, with
 * no Python object between them. */
#ifndef LOADGEN_READER_API_H
#define LOADGEN_READER_API_H

#include <Python.h>

#define READER_API_CAPSULE "loadgen.engine._reader._C_API"
#define RAW_CONSUMER_CAPSULE "loadgen.engine._reader.raw_consumer"
#define READER_API_VERSION 1

/* One complete line of the body (without its line end), valid during the call only: 0 to go on,
 * -1 with an exception set to stop. */
typedef int (*reader_line_fn)(void *ctx, const char *line, Py_ssize_t n);

/* take_lines' results (BodyReader.take_lines: a list of lines, [] or None). */
enum { READ_MORE = 0, READ_LINES = 1, READ_END = 2 };

typedef struct {
    int version;
    PyTypeObject *body_reader_type;
    /* BodyReader.feed: 0, or -1 with the reader's error set (b"" is n == 0: the peer closed) */
    int (*feed)(PyObject *reader, const char *p, Py_ssize_t n);
    /* BodyReader.take_lines, each line to fn: READ_LINES, READ_MORE, READ_END or -1 */
    int (*take_lines)(PyObject *reader, reader_line_fn fn, void *ctx);
    int (*complete)(PyObject *reader);
} ReaderAPI;

/* A raw consumer: a capsule named RAW_CONSUMER_CAPSULE whose pointer is a RawConsumer and whose
 * context is the object fn is called with. fn gets one read's bytes (n == 0: the peer closed) and
 * its arrival: 1 when the stream ended, 0 for more, -1 with an exception set. */
typedef int (*raw_consume_fn)(void *ctx, const char *data, Py_ssize_t n, long long t_ns);
typedef struct {
    raw_consume_fn fn;
} RawConsumer;

#endif
