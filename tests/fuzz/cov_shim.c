/* Preloaded before gcc's libasan when the fuzzer runs (tests/fuzz/fuzz_reader.py, make fuzz).
 *
 * gcc's libasan defines the SanitizerCoverage entry points (__sanitizer_cov_*) as weak no-ops of
 * its own. Preloaded first, as ASan must be, they take the place of libFuzzer's inside atheris,
 * so atheris's Python coverage never reaches libFuzzer and no input is ever "interesting". This
 * library comes before libasan and forwards each of them to atheris's libFuzzer (the module named
 * by ATHERIS_CORE, loaded by atheris itself), and does nothing before that module is loaded.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

static void *core(void) {
    static void *handle;
    if (handle == NULL) {
        const char *path = getenv("ATHERIS_CORE");
        if (path != NULL) handle = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
    }
    return handle;
}

#define FORWARD(name, params, args)                                   \
    void name params {                                                \
        static void (*fn) params;                                     \
        if (fn == NULL) {                                             \
            void *h = core();                                         \
            if (h == NULL) return;                                    \
            fn = (void (*) params)dlsym(h, #name);                    \
            if (fn == NULL) return;                                   \
        }                                                             \
        fn args;                                                      \
    }

FORWARD(__sanitizer_cov_8bit_counters_init, (uint8_t *a, uint8_t *b), (a, b))
FORWARD(__sanitizer_cov_pcs_init, (const uintptr_t *a, const uintptr_t *b), (a, b))
FORWARD(__sanitizer_cov_trace_cmp1, (uint8_t a, uint8_t b), (a, b))
FORWARD(__sanitizer_cov_trace_cmp2, (uint16_t a, uint16_t b), (a, b))
FORWARD(__sanitizer_cov_trace_cmp4, (uint32_t a, uint32_t b), (a, b))
FORWARD(__sanitizer_cov_trace_cmp8, (uint64_t a, uint64_t b), (a, b))
FORWARD(__sanitizer_cov_trace_const_cmp1, (uint8_t a, uint8_t b), (a, b))
FORWARD(__sanitizer_cov_trace_const_cmp2, (uint16_t a, uint16_t b), (a, b))
FORWARD(__sanitizer_cov_trace_const_cmp4, (uint32_t a, uint32_t b), (a, b))
FORWARD(__sanitizer_cov_trace_const_cmp8, (uint64_t a, uint64_t b), (a, b))
FORWARD(__sanitizer_cov_trace_switch, (uint64_t a, uint64_t *b), (a, b))
FORWARD(__sanitizer_cov_trace_div4, (uint32_t a), (a))
FORWARD(__sanitizer_cov_trace_div8, (uint64_t a), (a))
FORWARD(__sanitizer_cov_trace_gep, (uintptr_t a), (a))
FORWARD(__sanitizer_cov_trace_pc_indir, (uintptr_t a), (a))
