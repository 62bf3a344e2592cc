/*
 * dlsym.c: dlsym interposition, so that programs that dlopen libcuda/libcudart and
 * dlsym the entry points get the wrappers too.
 *
 * The trap: glibc's dlsym resolves RTLD_NEXT relative to *its caller's* return address
 * (dlfcn/dlsym.c passes RETURN_ADDRESS(0) to _dl_sym).  A C wrapper that calls the real
 * dlsym would make every RTLD_NEXT lookup relative to the shim, and another preloaded
 * interposer calling dlsym(RTLD_NEXT, "open") would find itself and recurse forever.
 * So on x86-64 the exported dlsym is a few instructions of assembly: it asks C whether
 * the name is hooked and, if not, *jumps* (not calls) to the real dlsym, which then
 * sees the original caller.  The real dlsym comes from dlvsym, which is not
 * interposed, so there is no recursion either.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>

#include "shim.h"

SD_HIDDEN void *(*sd_next_dlsym)(void *, const char *);
static pthread_once_t sd_dlsym_once = PTHREAD_ONCE_INIT;

static void resolve_next_dlsym(void)
{
    /* glibc >= 2.34 has dlsym in libc.so.6 (GLIBC_2.34); older ones in libdl
     * (GLIBC_2.2.5).  Looked up in libc's own handle first: RTLD_NEXT needs glibc to map
     * our return address back to our object, which some hosts fail at ("RTLD_NEXT used
     * in code not dynamically loaded"), and libc's scope starts with libc itself. */
    static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    static const char *libs[] = {"libc.so.6", "libdl.so.2"};
    for (size_t l = 0; l < sizeof libs / sizeof *libs && !sd_next_dlsym; l++) {
        void *h = dlopen(libs[l], RTLD_LAZY | RTLD_NOLOAD);
        for (size_t i = 0; h && i < sizeof versions / sizeof *versions && !sd_next_dlsym; i++)
            sd_next_dlsym = (void *(*)(void *, const char *))dlvsym(h, "dlsym", versions[i]);
    }
    for (size_t i = 0; i < sizeof versions / sizeof *versions && !sd_next_dlsym; i++)
        sd_next_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", versions[i]);
}

void *sd_real_dlsym(void *handle, const char *name)
{
    pthread_once(&sd_dlsym_once, resolve_next_dlsym);
    return sd_next_dlsym ? sd_next_dlsym(handle, name) : NULL;
}

void *sd_driver_handle(void)
{
    static void *handle;
    void *h = __atomic_load_n(&handle, __ATOMIC_ACQUIRE);
    if (!h) {
        h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (h)
            __atomic_store_n(&handle, h, __ATOMIC_RELEASE);
    }
    return h;
}

/* -1: not ours (jump to the real dlsym); else the hook index */
SD_HIDDEN int sd_dlsym_hook_index(const char *name)
{
    pthread_once(&sd_dlsym_once, resolve_next_dlsym);
    return sd_hook_by_name(name);
}

SD_HIDDEN void *sd_dlsym_hooked(void *handle, const char *name, int hook)
{
    void *fn = NULL;
    if (handle != RTLD_DEFAULT && handle != RTLD_NEXT) {
        fn = sd_next_dlsym(handle, name);
        if (!fn)
            return NULL; /* dlerror() is already set by the real dlsym */
        if (fn != sd_hooks[hook].wrapper)
            sd_set_real(hook, fn);
    }
    /* RTLD_DEFAULT (and the main program's handle) find our own export first: the real
     * function is then the next definition, resolved the shim's way */
    if (!sd_real(hook)) {
        if (fn == sd_hooks[hook].wrapper)
            return fn;
        sd_next_dlsym(RTLD_NEXT, name); /* leaves dlerror() saying why */
        return NULL;
    }
    return sd_hooks[hook].wrapper;
}

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        "dlsym:\n"
        "  .cfi_startproc\n"
        "  pushq %rdi\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  pushq %rsi\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  subq $8, %rsp\n"
        "  .cfi_adjust_cfa_offset 8\n"
        "  movq %rsi, %rdi\n"
        "  call sd_dlsym_hook_index\n"
        "  addq $8, %rsp\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  popq %rsi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  popq %rdi\n"
        "  .cfi_adjust_cfa_offset -8\n"
        "  testl %eax, %eax\n"
        "  js 1f\n"
        "  movl %eax, %edx\n"
        "  jmp sd_dlsym_hooked\n"
        "1:\n"
        "  jmp *sd_next_dlsym(%rip)\n"
        "  .cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#else
/* Elsewhere a C wrapper: RTLD_NEXT lookups of other names resolve relative to the
 * shim (documented limitation in docs/shim.md). */
SD_EXPORT void *dlsym(void *handle, const char *name)
{
    int hook = sd_dlsym_hook_index(name);
    if (hook >= 0)
        return sd_dlsym_hooked(handle, name, hook);
    return sd_next_dlsym ? sd_next_dlsym(handle, name) : NULL;
}
#endif
