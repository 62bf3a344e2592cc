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
#include <stddef.h>

#include "hooks.h"
#include "real.h"

/* -1: not ours (jump to the real dlsym); else the hook index */
SD_HIDDEN int sd_dlsym_hook_index(const char *name)
{
    sd_resolve_next_dlsym();
    return sd_hook_by_name(name);
}

SD_HIDDEN void *sd_dlsym_hooked(void *handle, const char *name, int hook)
{
    void *fn = NULL;
    if (handle != RTLD_DEFAULT && handle != RTLD_NEXT) {
        fn = sd_next_dlsym(handle, name);
        if (!fn)
            return NULL; /* dlerror() is already set by the real dlsym */
        if (fn != sd_wrappers[hook])
            sd_set_real(hook, fn);
    }
    /* RTLD_DEFAULT (and the main program's handle) find our own export first: the real
     * function is then the next definition, resolved the shim's way */
    if (!sd_real(hook)) {
        if (fn == sd_wrappers[hook])
            return fn;
        sd_next_dlsym(RTLD_NEXT, name); /* leaves dlerror() saying why */
        return NULL;
    }
    return sd_wrappers[hook];
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
