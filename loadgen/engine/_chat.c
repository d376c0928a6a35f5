/* The compiled fast path of a stream's chunk lines: StreamState.take for the chunks nearly every
 * line is, without building a dict, an event or a method call per chunk. OpenAI chat (below),
 * OpenAI completions, llama-server's native stream, the Anthropic Messages and the OpenAI
 * Responses events, SGLang's native stream (read_llama, read_messages, read_responses,
 * take_sglang: each says what it takes).
 *
 * The reference is the Python path: loadgen/engine/sse_state.py (StreamState.take) with
 * targets/adapters/openai.py (_ChatStream.parse_line). ChatTaker.take(lines, t_recv_ns) applies
 * each line it fully understands to the same StreamState the Python path fills (its chunk times
 * and token counts, its text parts, reasoning tokens, first answer token, the stream's token
 * count and the worker's chunk counts), and hands the first line it does not, with every line
 * after it, to StreamState.take: so every error, message and rare shape is the Python path's own.
 *
 * A line is understood when it is "data: [DONE]" or an empty line, or "data: {" and a JSON object
 * this file validates completely (strict RFC 8259, UTF-8 checked, no \u escape, no number of
 * more than 15 digits or with an exponent over 2 digits, nesting up to 32: the rest goes to
 * orjson on the Python path) whose fields a chat chunk uses are in their plain shapes: no
 * "error", "usage" or "timings" object, "object" not "error", "choices" absent, null or a list
 * of at most one object with index 0 (or none), "delta" absent, null or an object with string or
 * null "content", "reasoning_content" and "reasoning", and "tool_calls" absent, null or a list;
 * no key of these repeated and no key with an escape. tests/unit/test_compiled_chat_diff.py holds
 * the two paths to the same state, line by line, on generated and hostile lines.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "_reader_api.h"

#define MAX_DEPTH 32

enum { J_NONE = 0, J_NULL, J_FALSE, J_TRUE, J_NUM, J_STR, J_ARR, J_OBJ };

typedef struct {
    int kind;
    const char *start;  /* the value's first byte (a string: its opening quote) */
    const char *end;    /* one past its last byte */
    int empty;          /* a string of no bytes, an array or object of no members */
    int escaped;        /* a string with a backslash escape (decoded on use) */
} JVal;

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

/* Bytes a string's scan must look at: the quote, the backslash, controls and non-ASCII (1);
 * every other byte is plain (0) and skipped in a tight loop. */
static unsigned char string_stop[256];

/* Bytes a skip over a validated object or array must look at: quotes and brackets (1). */
static unsigned char bracket_stop[256];

static void init_string_stop(void) {
    for (int c = 0; c < 256; c++) {
        string_stop[c] = c < 0x20 || c >= 0x80 || c == '"' || c == '\\';
        bracket_stop[c] = c == '"' || c == '{' || c == '}' || c == '[' || c == ']';
    }
}

/* Whether any of the 8 bytes at p is one a string's scan must look at (string_stop): the quote,
 * the backslash, a control or a non-ASCII byte. Word-at-a-time: a byte equal to c is a zero byte
 * of x ^ c, found by the carry of subtracting 1 from each (exact as a yes or no). */
static inline int any_string_stop8(const char *p) {
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    uint64_t x;
    memcpy(&x, p, 8);
    uint64_t quote = x ^ (ones * '"'), backslash = x ^ (ones * '\\');
    uint64_t hit = ((quote - ones) & ~quote) | ((backslash - ones) & ~backslash) | ((x - ones * 0x20) & ~x) | x;
    return (hit & highs) != 0;
}

/* A JSON string at p (its opening quote): its end, or NULL for anything not taken here. */
static const char *scan_string(const char *p, const char *end, int *escaped) {
    p++;
    *escaped = 0;
    while (p < end) {
        while (end - p >= 8 && !any_string_stop8(p)) p += 8;
        while (p < end && !string_stop[(unsigned char)*p]) p++;
        if (p >= end) break;
        unsigned char c = (unsigned char)*p;
        if (c == '"') return p + 1;
        if (c == '\\') {
            if (p + 1 >= end) return NULL;
            char e = p[1];
            if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
                *escaped = 1;
                p += 2;
                continue;
            }
            return NULL;  /* \u (surrogates: orjson's rules) or an invalid escape */
        }
        if (c < 0x20) return NULL;
        if (c < 0x80) { p++; continue; }
        /* UTF-8: the well-formed sequences of RFC 3629 only */
        Py_ssize_t n;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) n = 1;
        else if (c == 0xE0) { n = 2; lo = 0xA0; }
        else if (c >= 0xE1 && c <= 0xEC) n = 2;
        else if (c == 0xED) { n = 2; hi = 0x9F; }
        else if (c >= 0xEE && c <= 0xEF) n = 2;
        else if (c == 0xF0) { n = 3; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) n = 3;
        else if (c == 0xF4) { n = 3; hi = 0x8F; }
        else return NULL;
        if (end - p <= n) return NULL;
        unsigned char c1 = (unsigned char)p[1];
        if (c1 < lo || c1 > hi) return NULL;
        for (Py_ssize_t i = 2; i <= n; i++) {
            unsigned char ci = (unsigned char)p[i];
            if (ci < 0x80 || ci > 0xBF) return NULL;
        }
        p += n + 1;
    }
    return NULL;
}

static const char *scan_number(const char *p, const char *end) {
    int digits = 0;
    if (p < end && *p == '-') p++;
    if (p >= end) return NULL;
    if (*p == '0') { p++; digits++; }
    else if (*p >= '1' && *p <= '9') { while (p < end && *p >= '0' && *p <= '9') { p++; digits++; } }
    else return NULL;
    if (p < end && *p == '.') {
        p++;
        if (p >= end || *p < '0' || *p > '9') return NULL;
        while (p < end && *p >= '0' && *p <= '9') { p++; digits++; }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        int exp = 0;
        if (p >= end || *p < '0' || *p > '9') return NULL;
        while (p < end && *p >= '0' && *p <= '9') { p++; exp++; }
        if (exp > 2) return NULL;
    }
    if (digits > 15) return NULL;
    return p;
}

/* What one scan takes out of the value it validates, so the members a chunk uses are found in the
 * same pass (find_members and skip_known walk a validated value again). For an object: the
 * members named keys[] into out[] (J_NONE for those absent), each value scanned with sub[i] when
 * that is set; bad when a wanted key is repeated or any key has an escape (find_members' -1). For
 * an array (is_array): its first element into first, scanned with elem, and its elements counted
 * (up to 2). A value of another kind than the want's leaves it untouched. */
typedef struct Want Want;
struct Want {
    int nkeys;
    const char *const *keys;
    const unsigned char *klens;
    JVal *out;
    Want *const *sub;
    int bad;
    int is_array;
    Want *elem;
    JVal first;
    int count;
};

static void want_reset(Want *w) {
    if (w == NULL) return;
    w->bad = 0;
    w->count = 0;
    w->first.kind = J_NONE;
    for (int i = 0; i < w->nkeys; i++) {
        w->out[i].kind = J_NONE;
        if (w->sub != NULL) want_reset(w->sub[i]);
    }
    want_reset(w->elem);
}

static const char *scan_value(const char *p, const char *end, int depth, JVal *v, Want *want);

static const char *scan_literal(const char *p, const char *end, const char *word, int kind, JVal *v) {
    size_t n = strlen(word);
    if ((size_t)(end - p) < n || memcmp(p, word, n) != 0) return NULL;
    v->kind = kind;
    v->start = p;
    v->end = p + n;
    return p + n;
}

static const char *scan_value(const char *p, const char *end, int depth, JVal *v, Want *want) {
    if (depth > MAX_DEPTH) return NULL;
    p = skip_ws(p, end);
    if (p >= end) return NULL;
    v->start = p;
    v->empty = 0;
    v->escaped = 0;
    char c = *p;
    if (c == '"') {
        const char *q = scan_string(p, end, &v->escaped);
        if (q == NULL) return NULL;
        v->kind = J_STR;
        v->end = q;
        v->empty = (q - p) == 2;
        return q;
    }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        v->kind = c == '{' ? J_OBJ : J_ARR;
        Want *members = want != NULL && !want->is_array && c == '{' ? want : NULL;
        Want *elements = want != NULL && want->is_array && c == '[' ? want : NULL;
        p = skip_ws(p + 1, end);
        if (p < end && *p == close) { v->empty = 1; v->end = p + 1; return p + 1; }
        for (;;) {
            JVal item;
            int hit = -1;
            Want *inner = NULL;
            if (c == '{') {
                p = skip_ws(p, end);
                if (p >= end || *p != '"') return NULL;
                int esc;
                const char *key = p + 1;
                p = scan_string(p, end, &esc);
                if (p == NULL) return NULL;
                if (members != NULL) {
                    size_t klen = (size_t)((p - 1) - key);
                    if (esc) members->bad = 1;
                    else
                        for (int i = 0; i < members->nkeys; i++)
                            if (members->klens[i] == klen && members->keys[i][0] == key[0] &&
                                memcmp(members->keys[i], key, klen) == 0) {
                                hit = i;
                                if (members->sub != NULL) inner = members->sub[i];
                                break;
                            }
                }
                p = skip_ws(p, end);
                if (p >= end || *p != ':') return NULL;
                p++;
            } else if (elements != NULL && elements->count == 0) {
                inner = elements->elem;
            }
            p = scan_value(p, end, depth + 1, &item, inner);
            if (p == NULL) return NULL;
            if (hit >= 0) {
                if (members->out[hit].kind != J_NONE) members->bad = 1;
                members->out[hit] = item;
            } else if (elements != NULL) {
                if (elements->count == 0) elements->first = item;
                if (elements->count < 2) elements->count++;
            }
            p = skip_ws(p, end);
            if (p >= end) return NULL;
            if (*p == ',') { p++; continue; }
            if (*p == close) { v->end = p + 1; return p + 1; }
            return NULL;
        }
    }
    if (c == 't') return scan_literal(p, end, "true", J_TRUE, v);
    if (c == 'f') return scan_literal(p, end, "false", J_FALSE, v);
    if (c == 'n') return scan_literal(p, end, "null", J_NULL, v);
    if (c == '-' || (c >= '0' && c <= '9')) {
        const char *q = scan_number(p, end);
        if (q == NULL) return NULL;
        v->kind = J_NUM;
        v->end = q;
        return q;
    }
    return NULL;
}

/* The end of the string at p (its opening quote) of JSON scan_value has validated, and whether
 * it has an escape: no checks, the validation was done. */
static const char *skip_string(const char *p, int *escaped) {
    p++;
    for (;;) {
        while (*p != '"' && *p != '\\') p++;
        char c = *p;
        if (c == '"') return p + 1;
        if (c == '\\') { *escaped = 1; p += 2; } else p++;
    }
}

/* The value at p (no white space before it) of JSON scan_value has validated, into v: its end.
 * Objects and arrays are skipped over by their brackets, outside strings. */
static const char *skip_known(const char *p, JVal *v) {
    v->start = p;
    v->empty = 0;
    v->escaped = 0;
    char c = *p;
    if (c == '"') {
        const char *q = skip_string(p, &v->escaped);
        v->kind = J_STR;
        v->empty = (q - p) == 2;
        return v->end = q;
    }
    if (c == '{' || c == '[') {
        v->kind = c == '{' ? J_OBJ : J_ARR;
        const char *q = p + 1;
        while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r') q++;
        if (*q == '}' || *q == ']') { v->empty = 1; return v->end = q + 1; }
        int depth = 1, esc;
        while (depth > 0) {
            while (!bracket_stop[(unsigned char)*q]) q++;
            char d = *q;
            if (d == '"') { q = skip_string(q, &esc); continue; }
            if (d == '{' || d == '[') depth++;
            else if (d == '}' || d == ']') depth--;
            q++;
        }
        return v->end = q;
    }
    if (c == 't') { v->kind = J_TRUE; return v->end = p + 4; }
    if (c == 'f') { v->kind = J_FALSE; return v->end = p + 5; }
    if (c == 'n') { v->kind = J_NULL; return v->end = p + 4; }
    v->kind = J_NUM;
    while ((*p >= '0' && *p <= '9') || *p == '-' || *p == '+' || *p == '.' || *p == 'e' || *p == 'E') p++;
    return v->end = p;
}

/* The members named in keys[] of an object already validated by scan_value, into out[] (J_NONE
 * for those absent). -1 when one is repeated or any key has an escape (the Python path decides). */
/* Whether the n bytes at s (a validated key: no NUL in it) are the key name. */
static int key_is(const char *name, const char *s, size_t n) {
    for (size_t j = 0; j < n; j++)
        if (name[j] != s[j]) return 0;  /* name's NUL ends the match too */
    return name[n] == '\0';
}

static int find_members(const JVal *obj, const char *const *keys, int nkeys, JVal *out) {
    for (int i = 0; i < nkeys; i++) out[i].kind = J_NONE;
    if (obj->empty) return 0;
    const char *p = obj->start + 1, *end = obj->end;
    for (;;) {
        p = skip_ws(p, end);
        int esc = 0;
        const char *kstart = p + 1;
        const char *q = skip_string(p, &esc);
        if (esc) return -1;
        size_t klen = (size_t)((q - 1) - kstart);
        p = skip_ws(skip_ws(q, end) + 1, end);  /* past ':' */
        JVal val;
        p = skip_known(p, &val);
        for (int i = 0; i < nkeys; i++) {
            if (key_is(keys[i], kstart, klen)) {
                if (out[i].kind != J_NONE) return -1;
                out[i] = val;
            }
        }
        p = skip_ws(p, end);
        if (*p == ',') { p++; continue; }
        return 0;
    }
}

/* A validated string's text as a str (escapes decoded); NULL with an exception set on failure. */
static PyObject *string_value(const JVal *s, const JVal *prefix) {
    Py_ssize_t n1 = prefix ? (prefix->end - prefix->start - 2) : 0;
    Py_ssize_t n2 = s->end - s->start - 2;
    if (!s->escaped && (prefix == NULL || !prefix->escaped)) {
        if (prefix == NULL) return PyUnicode_DecodeUTF8(s->start + 1, n2, "strict");
    }
    char *buf = PyMem_Malloc((size_t)(n1 + n2) + 1);
    if (buf == NULL) return PyErr_NoMemory();
    Py_ssize_t k = 0;
    const JVal *parts[2] = {prefix, s};
    for (int j = 0; j < 2; j++) {
        const JVal *v = parts[j];
        if (v == NULL) continue;
        const char *p = v->start + 1, *e = v->end - 1;
        while (p < e) {
            if (*p != '\\') { buf[k++] = *p++; continue; }
            char c = p[1];
            p += 2;
            switch (c) {
                case 'b': buf[k++] = '\b'; break;
                case 'f': buf[k++] = '\f'; break;
                case 'n': buf[k++] = '\n'; break;
                case 'r': buf[k++] = '\r'; break;
                case 't': buf[k++] = '\t'; break;
                default: buf[k++] = c; break;  /* " \ / */
            }
        }
    }
    PyObject *out = PyUnicode_DecodeUTF8(buf, k, "strict");
    PyMem_Free(buf);
    return out;
}

static int is_literal_zero(const JVal *v) {
    return v->kind == J_NUM && v->end - v->start == 1 && v->start[0] == '0';
}

/* What one chunk line says, when it is in the plain shapes (module docstring). */
enum { LINE_FALLBACK = -1, LINE_NOTHING = 0, LINE_CHUNK = 1, LINE_DONE = 2 };

typedef struct {
    int generated;
    long tokens;        /* a generated chunk's tokens: 1, or llama-server's tokens list's length */
    int reasoning;
    JVal content;       /* J_STR when it is the text (with reasoning_prefix before it, if any) */
    JVal text_prefix;   /* reasoning kept in the text (keep_reasoning) */
    int has_text;
    int has_prefix;
} Chunk;

enum { MODE_CHAT = 0, MODE_COMPLETIONS = 1, MODE_LLAMA = 2, MODE_MESSAGES = 3, MODE_RESPONSES = 4, MODE_SGLANG = 5 };

/* An unescaped string value equal to lit. */
static int str_is(const JVal *v, const char *lit) {
    size_t n = strlen(lit);
    return v->kind == J_STR && !v->escaped && (size_t)(v->end - v->start - 2) == n && memcmp(v->start + 1, lit, n) == 0;
}

/* text_or_empty (targets/adapters/base.py) as a test: 1 for a non-empty string, 0 for an empty
 * one, null or none, -1 for anything else (BadChunk there: the Python path says so). */
static int text_present(const JVal *v) {
    if (v->kind == J_NONE || v->kind == J_NULL) return 0;
    if (v->kind != J_STR) return -1;
    return !v->empty;
}

/* A delta event's text: a token chunk when there is text (reasoning or not; the reply's own
 * text when is_content), nothing when it is empty, Python's when it is not a string. */
static int delta_chunk(const JVal *text, int reasoning, int is_content, Chunk *ch) {
    int t = text_present(text);
    if (t < 0) return LINE_FALLBACK;
    if (t == 0) return LINE_NOTHING;
    ch->generated = 1;
    ch->reasoning = reasoning;
    if (is_content) { ch->content = *text; ch->has_text = 1; }
    return LINE_CHUNK;
}

/* An Anthropic Messages event (targets/adapters/anthropic.py, _MessagesStream.parse_line): the
 * content_block_delta events of text, thinking and tool input, the events that carry nothing,
 * and message_stop. message_start and message_delta (usage), errors and unknown types: Python. */
static int read_messages(const JVal *top, Chunk *ch) {
    static const char *const keys[] = {"type", "delta"};
    JVal v[2];
    if (find_members(top, keys, 2, v) < 0) return LINE_FALLBACK;
    if (v[0].kind != J_STR || v[0].escaped) return LINE_FALLBACK;
    if (str_is(&v[0], "content_block_delta")) {
        if (v[1].kind != J_OBJ) return LINE_FALLBACK;
        static const char *const dkeys[] = {"type", "text", "thinking", "partial_json"};
        JVal d[4];
        if (find_members(&v[1], dkeys, 4, d) < 0) return LINE_FALLBACK;
        if (d[0].kind != J_STR || d[0].escaped) return LINE_FALLBACK;
        int field = str_is(&d[0], "text_delta") ? 1 : str_is(&d[0], "thinking_delta") ? 2
                  : str_is(&d[0], "input_json_delta") ? 3 : 0;
        if (field == 0) return LINE_NOTHING;  /* signature_delta, citations_delta */
        return delta_chunk(&d[field], field == 2, field == 1, ch);
    }
    if (str_is(&v[0], "content_block_start") || str_is(&v[0], "content_block_stop") || str_is(&v[0], "ping"))
        return LINE_NOTHING;
    if (str_is(&v[0], "message_stop")) return LINE_DONE;
    return LINE_FALLBACK;
}

/* An OpenAI Responses event (targets/adapters/responses.py, _ResponsesStream.parse_line): the
 * output text, reasoning, refusal and function-call argument deltas, and the event types that
 * carry nothing. The ends (usage), response.created (the server-side history's id), failures and
 * errors: Python. */
static int read_responses(const JVal *top, Chunk *ch) {
    static const char *const keys[] = {"type", "delta"};
    JVal v[2];
    if (find_members(top, keys, 2, v) < 0) return LINE_FALLBACK;
    if (v[0].kind != J_STR || v[0].escaped) return LINE_FALLBACK;
    int kind = str_is(&v[0], "response.output_text.delta") ? 1
             : (str_is(&v[0], "response.reasoning_text.delta") || str_is(&v[0], "response.reasoning_summary_text.delta")) ? 2
             : (str_is(&v[0], "response.refusal.delta") || str_is(&v[0], "response.function_call_arguments.delta")) ? 3
             : 0;
    if (kind == 0) {
        if (str_is(&v[0], "response.completed") || str_is(&v[0], "response.incomplete") ||
            str_is(&v[0], "response.created") || str_is(&v[0], "response.failed") || str_is(&v[0], "error"))
            return LINE_FALLBACK;
        return LINE_NOTHING;  /* event types that carry nothing loadgen counts */
    }
    return delta_chunk(&v[1], kind == 2, kind == 1, ch);
}

/* llama-server's native /completion chunk (targets/adapters/llamacpp.py, _LlamaStream): the
 * top-level "content", its tokens' count ("tokens", a list of ids, else one), and no "stop". */
static int read_llama(const JVal *top, Chunk *ch) {
    static const char *const keys[] = {"error", "object", "content", "stop", "tokens"};
    JVal v[5];
    if (find_members(top, keys, 5, v) < 0) return LINE_FALLBACK;
    if (v[0].kind != J_NONE) return LINE_FALLBACK;
    if (v[1].kind == J_STR && (v[1].escaped || (v[1].end - v[1].start == 7 && memcmp(v[1].start, "\"error\"", 7) == 0)))
        return LINE_FALLBACK;
    if (v[3].kind != J_NONE && v[3].kind != J_NULL && v[3].kind != J_FALSE) return LINE_FALLBACK;  /* the last chunk */
    if (v[2].kind != J_NONE && v[2].kind != J_NULL && v[2].kind != J_STR) return LINE_FALLBACK;
    if (v[2].kind != J_STR || v[2].empty) return LINE_NOTHING;
    long tokens = 1;
    if (v[4].kind == J_ARR && !v[4].empty) {
        tokens = 0;
        const char *q = v[4].start + 1;
        for (;;) {
            JVal item;
            q = skip_known(skip_ws(q, v[4].end), &item);
            tokens++;
            q = skip_ws(q, v[4].end);
            if (*q == ',') { q++; continue; }
            break;
        }
    } else if (v[4].kind != J_NONE && v[4].kind != J_NULL && v[4].kind != J_ARR) {
        return LINE_FALLBACK;
    }
    ch->generated = 1;
    ch->tokens = tokens;
    ch->content = v[2];
    ch->has_text = 1;
    return LINE_CHUNK;
}

/* What every mode's line is first: blank (LINE_NOTHING), the end marker (LINE_DONE; llama-server
 * sends none), an event's name line (LINE_NOTHING, for the APIs that send one), or "data: " and
 * one JSON object, validated into *top (LINE_CHUNK); anything else is LINE_FALLBACK. */
static int data_object(const char *line, Py_ssize_t n, int mode, JVal *top, Want *want) {
    if (n == 0 || (n == 1 && line[0] == '\r')) return LINE_NOTHING;
    if (mode != MODE_LLAMA && n >= 12 && memcmp(line, "data: [DONE]", 12) == 0 && (n == 12 || (n == 13 && line[12] == '\r')))
        return LINE_DONE;
    /* the event's name: these two APIs send one before each data line; sse_payload skips it */
    if ((mode == MODE_MESSAGES || mode == MODE_RESPONSES) && n >= 6 && memcmp(line, "event:", 6) == 0)
        return LINE_NOTHING;
    if (n < 7 || memcmp(line, "data: {", 7) != 0) return LINE_FALLBACK;
    const char *end = line + n;
    want_reset(want);
    const char *p = scan_value(line + 6, end, 0, top, want);
    return p == NULL || skip_ws(p, end) != end ? LINE_FALLBACK : LINE_CHUNK;
}

/* The members of an OpenAI chat or completions chunk read_line looks at, found in the one scan
 * that validates the line: top-level, the first choice's, its delta's. */
static const char *const top_keys[] = {"error", "object", "usage", "timings", "choices"};
static const unsigned char top_klens[] = {5, 6, 5, 7, 7};
static const char *const c0_keys[] = {"index", "delta", "text"};
static const unsigned char c0_klens[] = {5, 5, 4};
static const char *const d_keys[] = {"content", "reasoning_content", "reasoning", "tool_calls"};
static const unsigned char d_klens[] = {7, 17, 9, 10};

static int read_line(const char *line, Py_ssize_t n, int mode, int keep_reasoning, Chunk *ch) {
    memset(ch, 0, sizeof(*ch));
    ch->tokens = 1;
    JVal top;
    if (mode == MODE_LLAMA || mode == MODE_MESSAGES || mode == MODE_RESPONSES) {
        int head = data_object(line, n, mode, &top, NULL);
        if (head != LINE_CHUNK) return head;
        if (mode == MODE_LLAMA) return read_llama(&top, ch);
        if (mode == MODE_MESSAGES) return read_messages(&top, ch);
        return read_responses(&top, ch);
    }
    if (n < 7 || memcmp(line, "data: {", 7) != 0) return data_object(line, n, mode, &top, NULL);
    JVal tv[5], cv[3], dv[4];
    Want delta_w = {.nkeys = 4, .keys = d_keys, .klens = d_klens, .out = dv};
    Want *c0_sub[3] = {NULL, &delta_w, NULL};
    Want c0_w = {.nkeys = 3, .keys = c0_keys, .klens = c0_klens, .out = cv, .sub = c0_sub};
    Want choices_w = {.is_array = 1, .elem = &c0_w};
    Want *top_sub[5] = {NULL, NULL, NULL, NULL, &choices_w};
    Want top_w = {.nkeys = 5, .keys = top_keys, .klens = top_klens, .out = tv, .sub = top_sub};
    int head = data_object(line, n, mode, &top, &top_w);
    if (head != LINE_CHUNK) return head;
    if (top_w.bad) return LINE_FALLBACK;
    if (tv[0].kind != J_NONE) return LINE_FALLBACK;
    if (tv[1].kind == J_STR && tv[1].end - tv[1].start == 7 && memcmp(tv[1].start, "\"error\"", 7) == 0)
        return LINE_FALLBACK;
    if (tv[1].kind == J_STR && tv[1].escaped) return LINE_FALLBACK;
    if (tv[2].kind != J_NONE && tv[2].kind != J_NULL) return LINE_FALLBACK;
    if (tv[3].kind == J_OBJ) return LINE_FALLBACK;
    const JVal *choices = &tv[4];
    if (choices->kind == J_NONE || choices->kind == J_NULL) return LINE_NOTHING;
    if (choices->kind != J_ARR) return LINE_FALLBACK;
    if (choices->empty) return LINE_NOTHING;
    /* the first element, and that it is the only one */
    if (choices_w.first.kind != J_OBJ) return LINE_FALLBACK;
    if (choices_w.count != 1) return LINE_FALLBACK;
    if (c0_w.bad) return LINE_FALLBACK;
    if (cv[0].kind != J_NONE && cv[0].kind != J_NULL && !is_literal_zero(&cv[0])) return LINE_FALLBACK;
    if (mode == MODE_COMPLETIONS) {
        /* choices[0].text: the text and the one token it stands for (_CompletionsStream) */
        const JVal *text = &cv[2];
        if (text->kind == J_NONE || text->kind == J_NULL) return LINE_NOTHING;
        if (text->kind != J_STR) return LINE_FALLBACK;
        if (text->empty) return LINE_NOTHING;
        ch->generated = 1;
        ch->content = *text;
        ch->has_text = 1;
        return LINE_CHUNK;
    }
    const JVal *delta = &cv[1];
    if (delta->kind == J_NONE || delta->kind == J_NULL) return LINE_NOTHING;
    if (delta->kind != J_OBJ) return LINE_FALLBACK;
    if (delta->empty) return LINE_NOTHING;
    if (delta_w.bad) return LINE_FALLBACK;
    for (int i = 0; i < 3; i++)
        if (dv[i].kind != J_NONE && dv[i].kind != J_NULL && dv[i].kind != J_STR) return LINE_FALLBACK;
    if (dv[3].kind != J_NONE && dv[3].kind != J_NULL && dv[3].kind != J_ARR) return LINE_FALLBACK;
    int tool_calls = dv[3].kind == J_ARR && !dv[3].empty;
    /* reasoning_content or reasoning: the first that is a non-empty string */
    const JVal *reasoning = NULL;
    if (dv[1].kind == J_STR && !dv[1].empty) reasoning = &dv[1];
    else if (dv[2].kind == J_STR && !dv[2].empty) reasoning = &dv[2];
    if (dv[0].kind == J_STR && !dv[0].empty) {
        ch->generated = 1;
        ch->content = dv[0];
        ch->has_text = 1;
        if (reasoning != NULL && keep_reasoning) { ch->text_prefix = *reasoning; ch->has_prefix = 1; }
    } else if (reasoning != NULL) {
        ch->generated = 1;
        ch->reasoning = !tool_calls;
        if (keep_reasoning) { ch->content = *reasoning; ch->has_text = 1; }
    } else {
        ch->generated = tool_calls;
    }
    return ch->generated || ch->has_text ? LINE_CHUNK : LINE_NOTHING;
}

/* ---- ChatTaker: a stream's state, fed in C ----
 *
 * What the chunks it understands say is kept here, in C (their stamps and token counts, the text
 * as UTF-8, the counts), and written to the Python state by flush(): at the end of every take()
 * and consume() call, before any line goes to the Python path, and, on the raw path (the Poller's
 * reads straight into raw_consume, no Python object per read), when the stream's reader is done
 * with it (client._follow calls flush() however the following ended). So Python never sees a
 * half-applied state, and the per-chunk work allocates nothing. */

typedef struct {
    PyObject_HEAD
    PyObject *state;        /* the StreamState */
    PyObject *stream;       /* its _ChatStream (counted) */
    PyObject *chunk_ns;     /* the state's lists */
    PyObject *chunk_tokens;
    PyObject *parts;
    PyObject *py_take;      /* StreamState.take, bound */
    PyObject *counts;       /* the state's ChunkCounts or None (set once, at the state's start) */
    int keep_reasoning;
    int mode;
    PyObject *resp;         /* consume(): the StampedResponse, its compiled BodyReader, the receive */
    PyObject *reader;       /* delays (a list, or None), and the state's dispatch */
    PyObject *delays;
    PyObject *delays_raw;   /* the delays' bytearray (health.RecvDelays.raw), when they have one */
    PyObject *dispatch;
    PyObject *usage_type;   /* SGLang: the adapters' Usage class (its events carry usage each) */
    int incremental;        /* SGLang: the server sends the new text only (incremental_text) */
    PyObject *feed;         /* the body reader's feed and take_lines, bound once at bind() */
    PyObject *take_lines;
    /* not yet flushed to the state */
    long long *p_t;         /* token chunks' stamps and tokens */
    long *p_tokens;
    Py_ssize_t p_n, p_cap;
    long p_token_chunks, p_coalesced, p_counted, p_reasoning;
    long long p_output_ns;  /* the first answer token's stamp, when the state has none yet */
    int p_has_output;
    char *text;             /* the text, UTF-8 */
    Py_ssize_t text_n, text_cap;
    long long read_t;       /* the raw path's last read: resp.t_recv_ns at the flush */
    int has_read;
    /* what the state held at the last flush, read once after it (-1: not read yet) */
    int known_output;       /* the state has an output_ns */
    int known_last;         /* chunk_ns is not empty: last_t is its last stamp */
    long long last_t;
    int known_pending;      /* state.pending is not None */
    /* one read's lines on the raw path */
    long long line_t;
    int line_done;
    PyObject *collect;      /* the lines from the first the C side does not take, for Python */
} ChatTaker;

static const ReaderAPI *reader_api;  /* the body reader's C calls (NULL: _reader is not built) */

static PyObject *s_incremental, *s_seen_chars, *s_seen_tokens, *s_usage;
static PyObject *s_dispatch, *s_consume, *s_t_recv_ns, *s_feed, *s_complete, *s_message_complete, *s_take_lines;
static PyObject *s_pending, *s_counts, *s_token_chunks, *s_coalesced, *s_reasoning, *s_output_ns, *s_done,
    *s_counted, *s_keep_reasoning, *s_chunk_ns, *s_chunk_tokens, *s_parts, *s_take, *s_raw;

static void forget_known(ChatTaker *self) {
    self->known_output = self->known_last = self->known_pending = -1;
}

static void taker_dealloc(ChatTaker *self) {
    Py_XDECREF(self->state);
    Py_XDECREF(self->stream);
    Py_XDECREF(self->chunk_ns);
    Py_XDECREF(self->chunk_tokens);
    Py_XDECREF(self->parts);
    Py_XDECREF(self->py_take);
    Py_XDECREF(self->counts);
    Py_XDECREF(self->resp);
    Py_XDECREF(self->reader);
    Py_XDECREF(self->delays);
    Py_XDECREF(self->delays_raw);
    Py_XDECREF(self->dispatch);
    Py_XDECREF(self->feed);
    Py_XDECREF(self->take_lines);
    Py_XDECREF(self->usage_type);
    Py_XDECREF(self->collect);
    PyMem_Free(self->p_t);
    PyMem_Free(self->p_tokens);
    PyMem_Free(self->text);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int taker_init(ChatTaker *self, PyObject *args, PyObject *kwds) {
    PyObject *state, *stream, *usage_type = NULL;
    const char *mode = "openai-chat";
    if (!PyArg_ParseTuple(args, "OO|sO", &state, &stream, &mode, &usage_type)) return -1;
    /* the adapters' wire formats, by the names sse_state.COMPILED_PATHS gives */
    static const char *const names[] = {
        "openai-chat", "openai-completions", "llama-server", "anthropic-messages", "openai-responses", "sglang",
    };
    int found = -1;
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
        if (strcmp(mode, names[i]) == 0) found = i;  /* names[i] is mode i (the MODE_ enum) */
    if (found < 0) {
        PyErr_Format(PyExc_ValueError, "ChatTaker: no compiled path for %s", mode);
        return -1;
    }
    self->mode = found;
    self->keep_reasoning = 0;
    forget_known(self);
    if (self->mode == MODE_CHAT) {
        PyObject *keep = PyObject_GetAttr(stream, s_keep_reasoning);
        if (keep == NULL) return -1;
        self->keep_reasoning = PyObject_IsTrue(keep);
        Py_DECREF(keep);
        if (self->keep_reasoning < 0) return -1;
    } else if (self->mode == MODE_SGLANG) {
        if (usage_type == NULL || !PyCallable_Check(usage_type)) {
            PyErr_SetString(PyExc_TypeError, "ChatTaker: mode 'sglang' takes the Usage class as its fourth argument");
            return -1;
        }
        Py_INCREF(usage_type);
        Py_XSETREF(self->usage_type, usage_type);
        PyObject *inc = PyObject_GetAttr(stream, s_incremental);
        if (inc == NULL) return -1;
        self->incremental = PyObject_IsTrue(inc);
        Py_DECREF(inc);
        if (self->incremental < 0) return -1;
    }
    Py_INCREF(state);
    Py_XSETREF(self->state, state);
    Py_INCREF(stream);
    Py_XSETREF(self->stream, stream);
    Py_XSETREF(self->chunk_ns, PyObject_GetAttr(state, s_chunk_ns));
    Py_XSETREF(self->chunk_tokens, PyObject_GetAttr(state, s_chunk_tokens));
    Py_XSETREF(self->parts, PyObject_GetAttr(state, s_parts));
    Py_XSETREF(self->py_take, PyObject_GetAttr(state, s_take));
    Py_XSETREF(self->counts, PyObject_GetAttr(state, s_counts));
    if (!self->chunk_ns || !self->chunk_tokens || !self->parts || !self->py_take || !self->counts) return -1;
    if (!PyList_Check(self->chunk_ns) || !PyList_Check(self->chunk_tokens) || !PyList_Check(self->parts)) {
        PyErr_SetString(PyExc_TypeError, "ChatTaker: the state's chunk_ns, chunk_tokens and parts must be lists");
        return -1;
    }
    return 0;
}

static int add_to_attr(PyObject *obj, PyObject *name, long n) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    PyObject *one = PyLong_FromLong(n);
    if (one == NULL) { Py_DECREF(v); return -1; }
    PyObject *sum = PyNumber_Add(v, one);
    Py_DECREF(v);
    Py_DECREF(one);
    if (sum == NULL) return -1;
    int r = PyObject_SetAttr(obj, name, sum);
    Py_DECREF(sum);
    return r;
}

static int text_add(ChatTaker *self, const char *p, Py_ssize_t n) {
    if (n == 0) return 0;  /* nothing to copy, and no buffer yet to copy into (memcpy's NULL is UB) */
    if (self->text_n + n > self->text_cap) {
        Py_ssize_t cap = self->text_cap ? self->text_cap : 1024;
        while (cap < self->text_n + n) cap *= 2;
        char *b = PyMem_Realloc(self->text, (size_t)cap);
        if (b == NULL) { PyErr_NoMemory(); return -1; }
        self->text = b;
        self->text_cap = cap;
    }
    memcpy(self->text + self->text_n, p, (size_t)n);
    self->text_n += n;
    return 0;
}

/* A validated string's text (escapes decoded), UTF-8, onto the text. */
static int text_add_string(ChatTaker *self, const JVal *v) {
    const char *p = v->start + 1, *e = v->end - 1;
    if (!v->escaped) return text_add(self, p, e - p);
    while (p < e) {
        const char *q = p;
        while (q < e && *q != '\\') q++;
        if (text_add(self, p, q - p) < 0) return -1;
        if (q >= e) break;
        char c = q[1], out;
        switch (c) {
            case 'b': out = '\b'; break;
            case 'f': out = '\f'; break;
            case 'n': out = '\n'; break;
            case 'r': out = '\r'; break;
            case 't': out = '\t'; break;
            default: out = c; break;  /* " \ / */
        }
        if (text_add(self, &out, 1) < 0) return -1;
        p = q + 2;
    }
    return 0;
}

/* A token-bearing chunk's part of StreamState._apply: its time, its tokens, the counts. */
static int apply_tokens(ChatTaker *self, long n_tokens, int reasoning, long long t_ns) {
    if (self->counts != Py_None) {
        self->p_token_chunks++;
        if (self->known_last < 0) {
            Py_ssize_t n = PyList_GET_SIZE(self->chunk_ns);
            self->known_last = n > 0;
            if (n > 0) {
                self->last_t = PyLong_AsLongLong(PyList_GET_ITEM(self->chunk_ns, n - 1));
                if (self->last_t == -1 && PyErr_Occurred()) { self->known_last = -1; return -1; }
            }
        }
        if (self->known_last && self->last_t == t_ns) self->p_coalesced++;
    }
    if (self->p_n == self->p_cap) {
        Py_ssize_t cap = self->p_cap ? self->p_cap * 2 : 64;
        long long *t = PyMem_Realloc(self->p_t, (size_t)cap * sizeof(long long));
        if (t == NULL) { PyErr_NoMemory(); return -1; }
        self->p_t = t;
        long *k = PyMem_Realloc(self->p_tokens, (size_t)cap * sizeof(long));
        if (k == NULL) { PyErr_NoMemory(); return -1; }
        self->p_tokens = k;
        self->p_cap = cap;
    }
    self->p_t[self->p_n] = t_ns;
    self->p_tokens[self->p_n] = n_tokens;
    self->p_n++;
    self->known_last = 1;
    self->last_t = t_ns;
    /* the OpenAI streams count their tokens for continuous usage (_OpenAIStream.counted) */
    if (self->mode == MODE_CHAT || self->mode == MODE_COMPLETIONS) self->p_counted += n_tokens;
    if (reasoning) {
        self->p_reasoning += n_tokens;
    } else {
        if (self->known_output < 0) {
            PyObject *out = PyObject_GetAttr(self->state, s_output_ns);
            if (out == NULL) return -1;
            self->known_output = out != Py_None;
            Py_DECREF(out);
        }
        if (!self->known_output) {
            self->known_output = 1;
            self->p_has_output = 1;
            self->p_output_ns = t_ns;
        }
    }
    return 0;
}

/* Apply one understood chunk (StreamState.take's handling of its event). */
static int apply_chunk(ChatTaker *self, const Chunk *ch, long long t_ns) {
    if (ch->generated && apply_tokens(self, ch->tokens, ch->reasoning, t_ns) < 0) return -1;
    if (ch->has_text) {
        if (ch->has_prefix && text_add_string(self, &ch->text_prefix) < 0) return -1;
        if (text_add_string(self, &ch->content) < 0) return -1;
    }
    return 0;
}

static int set_long_attr(PyObject *obj, PyObject *name, long long x);

/* A count kept since the last flush, added to obj.name (and zeroed) when there is one. */
static int add_pending(PyObject *obj, PyObject *name, long *pending) {
    long n = *pending;
    if (n == 0) return 0;
    *pending = 0;
    return add_to_attr(obj, name, n);
}

/* What the chunks since the last flush said, onto the state (and the last read's stamp and the
 * body's completeness onto the reply, on the raw path). */
static int taker_flush(ChatTaker *self) {
    if (self->p_n > 0) {
        for (Py_ssize_t i = 0; i < self->p_n; i++) {
            PyObject *t = PyLong_FromLongLong(self->p_t[i]);
            if (t == NULL) return -1;
            int r = PyList_Append(self->chunk_ns, t);
            Py_DECREF(t);
            if (r < 0) return -1;
            PyObject *k = PyLong_FromLong(self->p_tokens[i]);
            if (k == NULL) return -1;
            r = PyList_Append(self->chunk_tokens, k);
            Py_DECREF(k);
            if (r < 0) return -1;
        }
        self->p_n = 0;
    }
    if (add_pending(self->counts, s_token_chunks, &self->p_token_chunks) < 0 ||
        add_pending(self->counts, s_coalesced, &self->p_coalesced) < 0 ||
        add_pending(self->stream, s_counted, &self->p_counted) < 0 ||
        add_pending(self->state, s_reasoning, &self->p_reasoning) < 0)
        return -1;
    if (self->p_has_output) {
        self->p_has_output = 0;
        if (set_long_attr(self->state, s_output_ns, self->p_output_ns) < 0) return -1;
    }
    if (self->text_n > 0) {
        PyObject *text = PyUnicode_DecodeUTF8(self->text, self->text_n, "strict");
        self->text_n = 0;
        if (text == NULL) return -1;
        int r = PyList_Append(self->parts, text);
        Py_DECREF(text);
        if (r < 0) return -1;
    }
    if (self->has_read && self->resp != NULL) {
        self->has_read = 0;
        if (set_long_attr(self->resp, s_t_recv_ns, self->read_t) < 0) return -1;
        if (PyObject_SetAttr(self->resp, s_message_complete, reader_api->complete(self->reader) ? Py_True : Py_False) < 0)
            return -1;
    }
    return 0;
}

/* A JSON integer literal (no fraction, no exponent) as a long long: 1, else 0 (a float). */
static int int_literal(const JVal *v, long long *out) {
    if (v->kind != J_NUM) return 0;
    for (const char *p = v->start; p < v->end; p++)
        if (*p == '.' || *p == 'e' || *p == 'E') return 0;
    char buf[32];
    Py_ssize_t n = v->end - v->start;
    if (n <= 0 || n >= (Py_ssize_t)sizeof(buf)) return 0;
    memcpy(buf, v->start, (size_t)n);
    buf[n] = 0;
    *out = strtoll(buf, NULL, 10);
    return 1;
}

/* count_or_none (targets/adapters/base.py): an integer >= 0 as a new int, else None. */
static PyObject *count_or_none(const JVal *v) {
    long long x;
    if (int_literal(v, &x) && x >= 0) return PyLong_FromLongLong(x);
    Py_RETURN_NONE;
}

static long long long_attr(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return x;
}

static int set_long_attr(PyObject *obj, PyObject *name, long long x) {
    PyObject *v = PyLong_FromLongLong(x);
    if (v == NULL) return -1;
    int r = PyObject_SetAttr(obj, name, v);
    Py_DECREF(v);
    return r;
}

/* SGLang's native /generate event (targets/adapters/sglang.py, _SGLangStream.event), applied to
 * the stream's state: the new text (the suffix past the characters seen, or the text itself with
 * incremental_text), the growth of meta_info.completion_tokens as the chunk's tokens, the usage
 * each event carries. An event with "error" or "object" (error_event), a finish_reason (the
 * engine's timings), a completion count that is not an integer, text that is not a string, or any
 * other shape: LINE_FALLBACK, nothing applied. Returns -2 with an exception set on failure. */
static int take_sglang(ChatTaker *self, const char *line, Py_ssize_t n, long long t_ns) {
    JVal top;
    int head = data_object(line, n, MODE_SGLANG, &top, NULL);
    if (head != LINE_CHUNK) return head;
    static const char *const keys[] = {"error", "object", "text", "meta_info"};
    JVal v[4];
    if (find_members(&top, keys, 4, v) < 0) return LINE_FALLBACK;
    if (v[0].kind != J_NONE || v[1].kind != J_NONE) return LINE_FALLBACK;
    const JVal *text = &v[2];
    if (text->kind != J_NONE && text->kind != J_NULL && text->kind != J_STR) return LINE_FALLBACK;
    static const char *const mkeys[] = {"prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason"};
    JVal m[4];
    for (int i = 0; i < 4; i++) m[i].kind = J_NONE;
    int meta = v[3].kind == J_OBJ && !v[3].empty;  /* a meta_info that is not an object is {} */
    if (meta && find_members(&v[3], mkeys, 4, m) < 0) return LINE_FALLBACK;
    if (m[3].kind != J_NONE && m[3].kind != J_NULL) return LINE_FALLBACK;  /* the last event */
    long long completion = 0;
    int has_completion = m[1].kind != J_NONE && m[1].kind != J_NULL;
    if (has_completion && !int_literal(&m[1], &completion)) return LINE_FALLBACK;
    /* the new text */
    PyObject *new_text = NULL;
    if (text->kind == J_STR) {
        PyObject *whole = string_value(text, NULL);
        if (whole == NULL) return -2;
        if (self->incremental) {
            new_text = whole;
        } else {
            long long seen = long_attr(self->stream, s_seen_chars);
            if (seen == -1 && PyErr_Occurred()) { Py_DECREF(whole); return -2; }
            Py_ssize_t len = PyUnicode_GET_LENGTH(whole);
            new_text = seen <= 0 ? (Py_INCREF(whole), whole) : PyUnicode_Substring(whole, (Py_ssize_t)seen, len);
            Py_DECREF(whole);
            if (new_text == NULL) return -2;
            if (set_long_attr(self->stream, s_seen_chars, len) < 0) { Py_DECREF(new_text); return -2; }
        }
    }
    int has_new = new_text != NULL && PyUnicode_GET_LENGTH(new_text) > 0;
    long long tokens = 0;
    if (has_completion) {
        long long seen = long_attr(self->stream, s_seen_tokens);
        if (seen == -1 && PyErr_Occurred()) { Py_XDECREF(new_text); return -2; }
        long long grown = completion - seen;
        if (grown > 0 && (has_new || text->kind != J_STR)) {
            tokens = grown;
            if (set_long_attr(self->stream, s_seen_tokens, completion) < 0) { Py_XDECREF(new_text); return -2; }
        } else if (has_new) {
            tokens = 1;
        }
    } else if (has_new) {
        tokens = 1;
    }
    int r = 0;
    if (tokens > 0) r = apply_tokens(self, (long)tokens, 0, t_ns);
    if (r == 0 && has_new) {
        Py_ssize_t size;
        const char *utf8 = PyUnicode_AsUTF8AndSize(new_text, &size);
        r = utf8 == NULL ? -1 : text_add(self, utf8, size);
    }
    Py_XDECREF(new_text);
    if (r < 0) return -2;
    if (meta) {  /* Usage(prompt, completion, cached), each a count or None */
        PyObject *counts[3] = {count_or_none(&m[0]), count_or_none(&m[1]), count_or_none(&m[2])};
        PyObject *usage = NULL;
        if (counts[0] != NULL && counts[1] != NULL && counts[2] != NULL)
            usage = PyObject_Vectorcall(self->usage_type, counts, 3, NULL);
        for (int i = 0; i < 3; i++) Py_XDECREF(counts[i]);
        if (usage == NULL) return -2;
        r = PyObject_SetAttr(self->state, s_usage, usage);
        Py_DECREF(usage);
        if (r < 0) return -2;
    }
    return LINE_CHUNK;
}


/* One line the C side takes: LINE_* (LINE_FALLBACK: Python's), or -2 with an exception set. */
static int take_one(ChatTaker *self, const char *line, Py_ssize_t n, long long t_ns) {
    if (self->mode == MODE_SGLANG) return take_sglang(self, line, n, t_ns);
    Chunk ch;
    int kind = read_line(line, n, self->mode, self->keep_reasoning, &ch);
    if (kind == LINE_CHUNK && apply_chunk(self, &ch, t_ns) < 0) return -2;
    return kind;
}

static int pending_known(ChatTaker *self) {
    if (self->known_pending < 0) {
        PyObject *pending = PyObject_GetAttr(self->state, s_pending);
        if (pending == NULL) return -1;
        self->known_pending = pending != Py_None;
        Py_DECREF(pending);
    }
    return self->known_pending;
}

/* The Python path's take(lines, t_recv_ns), after a flush: whatever it does to the state is read
 * anew after it. */
static PyObject *python_take(ChatTaker *self, PyObject *lines, PyObject *t_obj) {
    if (taker_flush(self) < 0) return NULL;
    forget_known(self);
    return PyObject_CallFunctionObjArgs(self->py_take, lines, t_obj, NULL);
}

static PyObject *taker_take_lines(ChatTaker *self, PyObject *lines, PyObject *t_obj) {
    long long t_ns = PyLong_AsLongLong(t_obj);
    if (t_ns == -1 && PyErr_Occurred()) return NULL;
    int has_pending = pending_known(self);
    if (has_pending < 0) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(lines), i = 0;
    if (!has_pending) {
        for (; i < n; i++) {
            PyObject *line = PyList_GET_ITEM(lines, i);
            if (!PyBytes_Check(line)) break;
            int kind = take_one(self, PyBytes_AS_STRING(line), PyBytes_GET_SIZE(line), t_ns);
            if (kind == -2) return NULL;
            if (kind == LINE_FALLBACK) break;
            if (kind == LINE_DONE) {
                if (taker_flush(self) < 0 || PyObject_SetAttr(self->state, s_done, Py_True) < 0) return NULL;
                Py_RETURN_TRUE;
            }
        }
        if (i == n) {
            if (taker_flush(self) < 0) return NULL;
            Py_RETURN_FALSE;
        }
    }
    /* The rest, from the first line not understood here, the Python path's way. */
    PyObject *rest = i == 0 ? (Py_INCREF(lines), lines) : PyList_GetSlice(lines, i, n);
    if (rest == NULL) return NULL;
    PyObject *r = python_take(self, rest, t_obj);
    Py_DECREF(rest);
    return r;
}

static PyObject *taker_take(ChatTaker *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "take(lines: list[bytes], t_recv_ns: int)");
        return NULL;
    }
    forget_known(self);  /* the state may have changed since the last call */
    return taker_take_lines(self, args[0], args[1]);
}

/* bind(resp, body_reader, delays) -> consume: the stream reader's callback for this reply,
 * client._follow's consume in C: the receive delay, the read into the compiled body reader, its
 * lines to take (the state's dispatch at the body's end). */
static PyObject *taker_bind(ChatTaker *self, PyObject *args) {
    PyObject *resp, *reader, *delays;
    if (!PyArg_ParseTuple(args, "OOO:bind", &resp, &reader, &delays)) return NULL;
    if (delays != Py_None && !PyList_Check(delays)) {
        PyErr_SetString(PyExc_TypeError, "bind: delays must be a list or None");
        return NULL;
    }
    PyObject *delays_raw = NULL;
    if (delays != Py_None) {
        delays_raw = PyObject_GetAttr(delays, s_raw);
        if (delays_raw == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return NULL;
            PyErr_Clear();
        } else if (!PyByteArray_Check(delays_raw)) {
            Py_CLEAR(delays_raw);
        }
    }
    PyObject *dispatch = PyObject_GetAttr(self->state, s_dispatch);
    if (dispatch == NULL) { Py_XDECREF(delays_raw); return NULL; }
    PyObject *feed = PyObject_GetAttr(reader, s_feed);
    PyObject *take_lines = feed == NULL ? NULL : PyObject_GetAttr(reader, s_take_lines);
    if (take_lines == NULL) {
        Py_DECREF(dispatch);
        Py_XDECREF(feed);
        Py_XDECREF(delays_raw);
        return NULL;
    }
    Py_XSETREF(self->feed, feed);
    Py_XSETREF(self->take_lines, take_lines);
    Py_INCREF(resp);
    Py_XSETREF(self->resp, resp);
    Py_INCREF(reader);
    Py_XSETREF(self->reader, reader);
    Py_INCREF(delays);
    Py_XSETREF(self->delays, delays);
    Py_XSETREF(self->delays_raw, delays_raw);
    Py_XSETREF(self->dispatch, dispatch);
    return PyObject_GetAttr((PyObject *)self, s_consume);
}

static long long monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);  /* time.perf_counter_ns's clock on Linux */
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static PyObject *taker_consume(ChatTaker *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || self->reader == NULL) {
        PyErr_SetString(PyExc_TypeError, "consume(data, t_recv_ns), after bind()");
        return NULL;
    }
    PyObject *data = args[0], *t_obj = args[1];
    long long t_ns = PyLong_AsLongLong(t_obj);
    if (t_ns == -1 && PyErr_Occurred()) return NULL;
    forget_known(self);  /* the state may have changed since the last call */
    if (PyObject_SetAttr(self->resp, s_t_recv_ns, t_obj) < 0) return NULL;
    if (self->delays != Py_None) {
        PyObject *d = PyLong_FromLongLong(monotonic_ns() - t_ns);
        if (d == NULL) return NULL;
        int r = PyList_Append(self->delays, d);
        Py_DECREF(d);
        if (r < 0) return NULL;
    }
    PyObject *fed = PyObject_Vectorcall(self->feed, &data, 1, NULL);
    if (fed == NULL) return NULL;
    Py_DECREF(fed);
    PyObject *complete = PyObject_GetAttr(self->reader, s_complete);
    if (complete == NULL) return NULL;
    int r = PyObject_SetAttr(self->resp, s_message_complete, complete);
    Py_DECREF(complete);
    if (r < 0) return NULL;
    for (;;) {
        PyObject *lines = PyObject_CallNoArgs(self->take_lines);
        if (lines == NULL) return NULL;
        if (lines == Py_None) { Py_DECREF(lines); Py_RETURN_FALSE; }
        if (!PyList_Check(lines)) {
            Py_DECREF(lines);
            PyErr_SetString(PyExc_TypeError, "consume: take_lines() gave neither a list nor None");
            return NULL;
        }
        if (PyList_GET_SIZE(lines) == 0) {
            Py_DECREF(lines);
            forget_known(self);
            PyObject *d = PyObject_CallNoArgs(self->dispatch);
            if (d == NULL) return NULL;
            Py_DECREF(d);
            Py_RETURN_TRUE;
        }
        PyObject *done = taker_take_lines(self, lines, t_obj);
        Py_DECREF(lines);
        if (done == NULL) return NULL;
        int last = PyObject_IsTrue(done);
        Py_DECREF(done);
        if (last < 0) return NULL;
        if (last) Py_RETURN_TRUE;
    }
}

/* ---- the raw path: the Poller's reads, straight from its buffer (_reader_api.h) ---- */

/* One line of a read: the C side's while it understands them, then every line of the read to
 * collect (for the Python path); nothing after the end marker. */
static int raw_line(void *ctx, const char *line, Py_ssize_t n) {
    ChatTaker *self = ctx;
    if (self->line_done) return 0;
    if (self->collect == NULL) {
        int has_pending = pending_known(self);
        if (has_pending < 0) return -1;
        if (!has_pending) {
            int kind = take_one(self, line, n, self->line_t);
            if (kind == -2) return -1;
            if (kind == LINE_DONE) self->line_done = 1;
            if (kind != LINE_FALLBACK) return 0;
        }
        self->collect = PyList_New(0);
        if (self->collect == NULL) return -1;
    }
    PyObject *b = PyBytes_FromStringAndSize(line, n);
    if (b == NULL) return -1;
    int r = PyList_Append(self->collect, b);
    Py_DECREF(b);
    return r;
}

/* consume() without the Python objects: the delay, the read into the body reader, its lines;
 * the state is written at the next flush. 1: the stream ended, 0: more, -1: an error. */
static int raw_consume(void *ctx, const char *data, Py_ssize_t n, long long t_ns) {
    ChatTaker *self = ctx;
    self->read_t = t_ns;
    self->has_read = 1;
    if (self->delays_raw != NULL) {
        long long d = monotonic_ns() - t_ns;
        Py_ssize_t at = PyByteArray_GET_SIZE(self->delays_raw);
        if (PyByteArray_Resize(self->delays_raw, at + (Py_ssize_t)sizeof d) < 0) return -1;
        memcpy(PyByteArray_AS_STRING(self->delays_raw) + at, &d, sizeof d);
    } else if (self->delays != Py_None) {
        PyObject *d = PyLong_FromLongLong(monotonic_ns() - t_ns);
        if (d == NULL) return -1;
        int r = PyList_Append(self->delays, d);
        Py_DECREF(d);
        if (r < 0) return -1;
    }
    if (reader_api->feed(self->reader, data, n) < 0) return -1;
    for (;;) {
        self->line_t = t_ns;
        self->line_done = 0;
        int rc = reader_api->take_lines(self->reader, raw_line, self);
        PyObject *collect = self->collect;
        self->collect = NULL;
        if (rc < 0) { Py_XDECREF(collect); return -1; }
        if (rc == READ_MORE) return 0;
        if (rc == READ_END) {
            if (taker_flush(self) < 0) return -1;
            forget_known(self);
            PyObject *d = PyObject_CallNoArgs(self->dispatch);
            if (d == NULL) return -1;
            Py_DECREF(d);
            return 1;
        }
        if (collect == NULL) {
            if (self->line_done) {
                if (taker_flush(self) < 0 || PyObject_SetAttr(self->state, s_done, Py_True) < 0) return -1;
                return 1;
            }
            continue;
        }
        PyObject *t_obj = PyLong_FromLongLong(t_ns);
        if (t_obj == NULL) { Py_DECREF(collect); return -1; }
        PyObject *done = python_take(self, collect, t_obj);
        Py_DECREF(t_obj);
        Py_DECREF(collect);
        if (done == NULL) return -1;
        int last = PyObject_IsTrue(done);
        Py_DECREF(done);
        if (last) return last < 0 ? -1 : 1;
    }
}

static RawConsumer raw_consumer = {raw_consume};

static void raw_capsule_free(PyObject *capsule) {
    Py_XDECREF((PyObject *)PyCapsule_GetContext(capsule));
}

/* raw() -> capsule: this taker as the Poller's raw consumer (after bind). */
static PyObject *taker_raw(ChatTaker *self, PyObject *Py_UNUSED(ignored)) {
    if (reader_api == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "raw: the compiled body reader (_reader) is not built");
        return NULL;
    }
    if (self->reader == NULL || Py_TYPE(self->reader) != reader_api->body_reader_type) {
        PyErr_SetString(PyExc_TypeError, "raw: bind() to a compiled BodyReader first");
        return NULL;
    }
    PyObject *capsule = PyCapsule_New(&raw_consumer, RAW_CONSUMER_CAPSULE, raw_capsule_free);
    if (capsule == NULL) return NULL;
    Py_INCREF(self);
    if (PyCapsule_SetContext(capsule, self) < 0) {
        Py_DECREF(self);
        Py_DECREF(capsule);
        return NULL;
    }
    return capsule;
}

/* consume_raw(data, t_recv_ns) -> bool: one read through the raw path (what the Poller calls),
 * for tests; the state is written at flush(). */
static PyObject *taker_consume_raw(ChatTaker *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "consume_raw(data: bytes, t_recv_ns: int)");
        return NULL;
    }
    PyObject *capsule = taker_raw(self, NULL);
    if (capsule == NULL) return NULL;
    Py_DECREF(capsule);
    long long t_ns = PyLong_AsLongLong(args[1]);
    if (t_ns == -1 && PyErr_Occurred()) return NULL;
    int r = raw_consume(self, PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), t_ns);
    if (r < 0) return NULL;
    return PyBool_FromLong(r);
}

static PyObject *taker_flush_method(ChatTaker *self, PyObject *Py_UNUSED(ignored)) {
    if (taker_flush(self) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef taker_methods[] = {
    {"bind", (PyCFunction)taker_bind, METH_VARARGS,
     "bind(resp, body_reader, delays) -> consume(data, t_recv_ns) -> bool: the reply's reads, in C."},
    {"consume", (PyCFunction)(void (*)(void))taker_consume, METH_FASTCALL,
     "consume(data, t_recv_ns) -> bool: one read of the reply (after bind)."},
    {"raw", (PyCFunction)taker_raw, METH_NOARGS,
     "raw() -> capsule: consume as the Poller's raw consumer, no Python object per read (after bind; "
     "the state is written at flush())."},
    {"consume_raw", (PyCFunction)(void (*)(void))taker_consume_raw, METH_FASTCALL,
     "consume_raw(data, t_recv_ns) -> bool: one read through the raw path (tests)."},
    {"flush", (PyCFunction)taker_flush_method, METH_NOARGS,
     "flush(): what the raw path has read so far, onto the state and the reply."},
    {"take", (PyCFunction)(void (*)(void))taker_take, METH_FASTCALL,
     "take(lines, t_recv_ns) -> bool: StreamState.take, chat chunks in C (module docstring)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ChatTakerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "loadgen.engine._chat.ChatTaker",
    .tp_basicsize = sizeof(ChatTaker),
    .tp_dealloc = (destructor)taker_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ChatTaker(state, stream, mode='openai-chat'): a stream's StreamState.take, its chunks in C; "
              "mode: openai-chat, openai-completions, llama-server, anthropic-messages, openai-responses, "
              "sglang (with the Usage class as a fourth argument).",
    .tp_methods = taker_methods,
    .tp_init = (initproc)taker_init,
    .tp_new = PyType_GenericNew,
};

static PyObject *py_read_line(PyObject *mod, PyObject *args) {
    /* For tests: what read_line makes of one line: None (left to Python), "nothing", "done", or
     * (generated, reasoning, text or None). */
    Py_buffer buf;
    int keep = 0;
    const char *mode = "openai-chat";
    if (!PyArg_ParseTuple(args, "y*|ps", &buf, &keep, &mode)) return NULL;
    Chunk ch;
    int m = strcmp(mode, "openai-completions") == 0 ? MODE_COMPLETIONS
          : strcmp(mode, "llama-server") == 0 ? MODE_LLAMA
          : strcmp(mode, "anthropic-messages") == 0 ? MODE_MESSAGES
          : strcmp(mode, "openai-responses") == 0 ? MODE_RESPONSES : MODE_CHAT;
    int kind = read_line(buf.buf, buf.len, m, keep, &ch);
    PyObject *out;
    if (kind == LINE_FALLBACK) { out = Py_None; Py_INCREF(out); }
    else if (kind == LINE_NOTHING) out = PyUnicode_FromString("nothing");
    else if (kind == LINE_DONE) out = PyUnicode_FromString("done");
    else {
        PyObject *text = Py_None;
        if (ch.has_text) {
            text = string_value(&ch.content, ch.has_prefix ? &ch.text_prefix : NULL);
            if (text == NULL) { PyBuffer_Release(&buf); return NULL; }
        } else Py_INCREF(text);
        out = m == MODE_LLAMA ? Py_BuildValue("(liN)", ch.tokens, ch.reasoning, text)
                              : Py_BuildValue("(iiN)", ch.generated, ch.reasoning, text);
    }
    PyBuffer_Release(&buf);
    return out;
}

static PyMethodDef module_methods[] = {
    {"read_line", py_read_line, METH_VARARGS, "read_line(line, keep_reasoning=False): what the fast path makes of a line"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef chat_module = {
    PyModuleDef_HEAD_INIT, "loadgen.engine._chat",
    "The compiled fast path of an OpenAI chat stream's lines (loadgen/engine/_chat.c).", -1, module_methods,
};

#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC PyInit__chat(void) {
    init_string_stop();
    INTERN(s_pending, "pending");
    INTERN(s_counts, "counts");
    INTERN(s_token_chunks, "token_chunks");
    INTERN(s_coalesced, "coalesced");
    INTERN(s_reasoning, "reasoning");
    INTERN(s_output_ns, "output_ns");
    INTERN(s_done, "done");
    INTERN(s_counted, "counted");
    INTERN(s_keep_reasoning, "keep_reasoning");
    INTERN(s_chunk_ns, "chunk_ns");
    INTERN(s_chunk_tokens, "chunk_tokens");
    INTERN(s_parts, "parts");
    INTERN(s_take, "take");
    INTERN(s_dispatch, "dispatch");
    INTERN(s_consume, "consume");
    INTERN(s_t_recv_ns, "t_recv_ns");
    INTERN(s_feed, "feed");
    INTERN(s_complete, "complete");
    INTERN(s_message_complete, "message_complete");
    INTERN(s_take_lines, "take_lines");
    INTERN(s_incremental, "incremental");
    INTERN(s_seen_chars, "seen_chars");
    INTERN(s_seen_tokens, "seen_tokens");
    INTERN(s_usage, "usage");
    INTERN(s_raw, "raw");
    /* the body reader's C calls, for the raw path; without them the rest works as before */
    reader_api = PyCapsule_Import(READER_API_CAPSULE, 0);
    if (reader_api == NULL || reader_api->version != READER_API_VERSION) {
        PyErr_Clear();
        reader_api = NULL;
    }
    if (PyType_Ready(&ChatTakerType) < 0) return NULL;
    PyObject *m = PyModule_Create(&chat_module);
    if (m == NULL) return NULL;
    Py_INCREF(&ChatTakerType);
    if (PyModule_AddIntConstant(m, "HAS_READER_API", reader_api != NULL) < 0 ||
        PyModule_AddObject(m, "ChatTaker", (PyObject *)&ChatTakerType) < 0) {
        Py_DECREF(&ChatTakerType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
