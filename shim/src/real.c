/*
 * real.c: the hooks' table and the real function behind each hook.
 *
 * A real function is resolved once, lazily: the next definition after the shim in the
 * global scope, else the already-loaded driver or runtime.  The shim never loads either
 * itself: no driver, no load, pass-through.  dlsym and cuGetProcAddress may also tell it
 * (sd_set_real).  The loader's own dlsym is looked up by version (dlvsym), since the shim
 * exports a dlsym of its own (dlsym.c).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "real.h"

const struct sd_hook_info sd_hooks[SD_HOOK_COUNT] = {
#define HOOK(ret, name, proc, since, flags, noreal, params, args) [SD_HOOK_##name] = {#name, proc, since, flags, 1},
#define DRIVER(name, proc, since) [SD_HOOK_##name] = {#name, proc, since, 0, 0},
#include "hooks.def"
};

void *(*sd_next_dlsym)(void *, const char *);
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

void sd_resolve_next_dlsym(void)
{
    pthread_once(&sd_dlsym_once, resolve_next_dlsym);
}

void *sd_real_dlsym(void *handle, const char *name)
{
    sd_resolve_next_dlsym();
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

void *sd_real_fn[SD_HOOK_COUNT];

/* Never given one of the shim's own wrappers: the ways a program hands the shim a function
 * (dlsym.c, cuGetProcAddress in hooks.c) leave those out first. */
void sd_set_real(int hook, void *fn)
{
    void *expected = NULL;
    if (fn)
        __atomic_compare_exchange_n(&sd_real_fn[hook], &expected, fn, 0, __ATOMIC_RELEASE,
                                    __ATOMIC_RELAXED);
}

/* Is fn one of ours (this copy or another copy of the shim loaded from elsewhere)?
 * Found with dladdr, never by a fixed path. */
static int sd_is_shim_address(void *fn)
{
    Dl_info self, other;
    if (!dladdr((void *)&sd_set_real, &self) || !dladdr(fn, &other))
        return 0;
    if (self.dli_fbase == other.dli_fbase)
        return 1;
    const char *a = strrchr(self.dli_fname, '/'), *b = strrchr(other.dli_fname, '/');
    a = a ? a + 1 : self.dli_fname;
    b = b ? b + 1 : other.dli_fname;
    return strcmp(a, b) == 0;
}

/* Slow path, once per hook: the next definition after the shim in the global scope,
 * else the already-loaded driver (libcudart dlopens libcuda.so.1 RTLD_LOCAL, so
 * RTLD_NEXT cannot see it).  The shim never loads the driver itself: no driver, no
 * load, pass-through. */
struct sd_loaded {
    const char *pattern;
    int n;
    char names[8][256];
};

static int collect_loaded(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct sd_loaded *found = data;
    if (info->dlpi_name && strstr(info->dlpi_name, found->pattern) && found->n < 8)
        snprintf(found->names[found->n++], sizeof found->names[0], "%s", info->dlpi_name);
    return 0;
}

/* `name` in an already-loaded library whose path contains `pattern` */
static void *lookup_in_loaded(const char *pattern, const char *name)
{
    struct sd_loaded found = {pattern, 0, {{0}}};
    dl_iterate_phdr(collect_loaded, &found); /* no dlopen inside: it holds the loader lock */
    for (int i = 0; i < found.n; i++) {
        void *h = dlopen(found.names[i], RTLD_LAZY | RTLD_NOLOAD);
        if (!h)
            continue;
        void *fn = sd_real_dlsym(h, name);
        dlclose(h);
        if (fn && !sd_is_shim_address(fn))
            return fn;
    }
    return NULL;
}

/* Slow path, once per hook: the next definition after the shim in the global scope;
 * else the already-loaded driver (libcudart dlopens libcuda.so.1 RTLD_LOCAL, so the
 * global scope cannot see it) or runtime.  The shim never loads either itself: no
 * driver, no load, pass-through. */
void *sd_resolve_real(int hook)
{
    const char *name = sd_hooks[hook].name;
    int runtime = sd_hooks[hook].flags & SD_HF_RUNTIME;
    void *fn = sd_real_dlsym(RTLD_NEXT, name);
    if (fn && sd_is_shim_address(fn))
        fn = NULL;
    if (!fn && !runtime) {
        void *driver = sd_driver_handle();
        if (driver)
            fn = sd_real_dlsym(driver, name);
        if (fn && sd_is_shim_address(fn))
            fn = NULL;
    }
    if (!fn)
        fn = lookup_in_loaded(runtime ? "libcudart" : "libcuda", name);
    if (fn)
        sd_set_real(hook, fn);
    return __atomic_load_n(&sd_real_fn[hook], __ATOMIC_ACQUIRE);
}

int sd_hook_by_name(const char *name)
{
    if (!name || name[0] != 'c' || name[1] != 'u')
        return -1;
    for (int i = 0; i < SD_HOOK_COUNT; i++)
        if (sd_hooks[i].wrapped && strcmp(sd_hooks[i].name, name) == 0)
            return i;
    return -1;
}
