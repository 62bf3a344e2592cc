/*
 * hooks.c: the exported wrappers, generated from hooks.def.
 *
 * Every wrapper is the same three steps: one load of sd_mode; when the shim is not
 * active (not started yet, SEEDANCE_DISABLE=1, version mismatch, a child that is not
 * followed) forward to the real function untouched; else call the area's
 * sd_impl_<name>() with the caller's return address.  Every path checks for a NULL
 * real function (no driver: the documented error code, never a crash).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

#include "shim.h"

#define HOOK(ret, name, proc, since, flags, noreal, params, args)                     \
    SD_EXPORT ret name params                                                          \
    {                                                                                  \
        if (SD_UNLIKELY(__atomic_load_n(&sd_mode, __ATOMIC_ACQUIRE) != SD_MODE_ACTIVE)) { \
            if (__atomic_load_n(&sd_mode, __ATOMIC_ACQUIRE) == SD_MODE_UNINIT)          \
                sd_init();                                                             \
            if (__atomic_load_n(&sd_mode, __ATOMIC_ACQUIRE) != SD_MODE_ACTIVE) {        \
                ret (*real_) params = (ret (*) params)sd_real(SD_HOOK_##name);        \
                return real_ ? real_ args : (ret)(noreal);                             \
            }                                                                          \
        }                                                                              \
        return sd_impl_##name(__builtin_return_address(0), SD_UNPAREN args);          \
    }
#include "hooks.def"

const struct sd_hook_info sd_hooks[SD_HOOK_COUNT] = {
#define HOOK(ret, name, proc, since, flags, noreal, params, args) \
    [SD_HOOK_##name] = {#name, proc, since, flags, 1, (void *)&name},
#define DRIVER(name, proc, since) [SD_HOOK_##name] = {#name, proc, since, 0, 0, NULL},
#include "hooks.def"
};

void *sd_real_fn[SD_HOOK_COUNT];

void sd_set_real(int hook, void *fn)
{
    void *expected = NULL;
    if (fn && fn != sd_hooks[hook].wrapper)
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
