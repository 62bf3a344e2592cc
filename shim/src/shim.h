/* shim.h: what the shim's C files share.  Not installed; Python never sees it. */
#ifndef SD_SHIM_H
#define SD_SHIM_H

#include "cuda_abi.h"
#include "../include/seedance_shim.h"

#define SD_EXPORT __attribute__((visibility("default")))
#define SD_HIDDEN __attribute__((visibility("hidden")))
#define SD_LIKELY(x) __builtin_expect(!!(x), 1)
#define SD_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define SD_UNPAREN(...) __VA_ARGS__

#define SD_LIB_UNKNOWN 0xFFFFu
#define SD_HF_PTSZ 1
#define SD_HF_RUNTIME 2

#ifndef SD_VERSION_STRING
#define SD_VERSION_STRING "0.1.0"
#endif

enum sd_hook_id {
#define HOOK(ret, name, proc, since, flags, noreal, params, args) SD_HOOK_##name,
#define DRIVER(name, proc, since) SD_HOOK_##name,
#include "hooks.def"
    SD_HOOK_COUNT
};
_Static_assert(SD_HOOK_COUNT <= SD_MAX_APIS, "raise SD_MAX_APIS (and SD_ABI_VERSION)");

/* The exported wrappers (hooks.c); with SD_CHECK_WITH_CUDA_H these redeclarations are
 * checked against cuda.h's own prototypes. */
#define HOOK(ret, name, proc, since, flags, noreal, params, args) SD_EXPORT ret name params;
#include "hooks.def"

/* One implementation per hook, in the file of its area; `caller` is the return address
 * of the application's call, for the calling-library attribution. */
#define HOOK(ret, name, proc, since, flags, noreal, params, args) \
    SD_HIDDEN ret sd_impl_##name(void *caller, SD_UNPAREN params);
#include "hooks.def"

struct sd_hook_info {
    const char *name;      /* exported symbol */
    const char *proc;      /* cuGetProcAddress symbol */
    int since;             /* first cudaVersion that gets this entry point */
    int flags;
    int wrapped;           /* 0 for DRIVER entries */
    void *wrapper;
};
SD_HIDDEN extern const struct sd_hook_info sd_hooks[SD_HOOK_COUNT];

/* The configuration, read once from the environment in the constructor (before main):
 * a program that changes SEEDANCE_* later (unsetenv("SEEDANCE_MEM_LIMIT"),
 * setenv("SEEDANCE_DISABLE", "1")) before its first CUDA call changes nothing (issue 10).
 * Strings are copied: the environment they came from may be freed or rewritten. */
struct sd_config {
    int disable;            /* SEEDANCE_DISABLE=1 */
    int verbose;            /* SEEDANCE_VERBOSE=1 */
    int events;             /* SEEDANCE_EVENTS=1 */
    int follow;             /* SEEDANCE_FOLLOW=1 */
    int own_handles;        /* SEEDANCE_HANDLES=per-instance */
    int owner_pid;          /* SEEDANCE_GROUP_OWNER: the `seedance run` that owns the group, 0 none */
    uint64_t group_key;     /* SEEDANCE_GROUP (hex), 0 none */
    char version[64];       /* SEEDANCE_SHIM_VERSION, "" none */
    char mem_limit[256];    /* SEEDANCE_MEM_LIMIT */
    char affinity[512];     /* SEEDANCE_AFFINITY */
    char runtime_dir[512];  /* SEEDANCE_RUNTIME_DIR, XDG_RUNTIME_DIR, HOME: the registry path */
    char xdg_runtime[512];
    char home[512];
#ifdef SEEDANCE_TEST_HOOKS
    int hold_lock_ms;       /* tests only: sleep inside the registry lock (never in the product) */
#endif
};
SD_HIDDEN extern struct sd_config sd_cfg;
SD_HIDDEN void sd_read_config(void);

/* mode: the whole fast-path test is one load of sd_mode */
enum { SD_MODE_UNINIT = 0, SD_MODE_ACTIVE = 1, SD_MODE_PASSTHROUGH = 2 };
SD_HIDDEN extern int sd_mode;
SD_HIDDEN extern int sd_events_on;   /* alloc/free events only when asked (--events) */
SD_HIDDEN extern int sd_own_handles;  /* SEEDANCE_HANDLES=per-instance */
SD_HIDDEN extern int sd_is_audit;    /* this copy was loaded by LD_AUDIT */
SD_HIDDEN extern struct sd_slot *sd_slot;
SD_HIDDEN extern struct sd_group *sd_group;
SD_HIDDEN extern struct sd_header *sd_registry;
SD_HIDDEN void sd_init(void);
SD_HIDDEN void sd_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
SD_HIDDEN void sd_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2))); /* note + stderr */

/* real entry points: resolved lazily, then one relaxed load */
SD_HIDDEN extern void *sd_real_fn[SD_HOOK_COUNT];
SD_HIDDEN void *sd_resolve_real(int hook);
static inline void *sd_real(int hook)
{
    void *fn = __atomic_load_n(&sd_real_fn[hook], __ATOMIC_ACQUIRE);
    return SD_LIKELY(fn != NULL) ? fn : sd_resolve_real(hook);
}
SD_HIDDEN void sd_set_real(int hook, void *fn);
#define SD_REAL(name) ((__typeof__(&name))sd_real(SD_HOOK_##name))
SD_HIDDEN int sd_hook_by_name(const char *name);

/* dlsym.c */
SD_HIDDEN void *sd_real_dlsym(void *handle, const char *name);
SD_HIDDEN void *sd_driver_handle(void);

/* registry.c */
SD_HIDDEN int sd_registry_path_in(const char *dir, const char *xdg, const char *home, char *buf, size_t len);
SD_HIDDEN int sd_registry_attach(void);
SD_HIDDEN void sd_registry_detach_at_exit(void);
SD_HIDDEN void sd_registry_after_fork(void);
SD_HIDDEN void sd_event(uint32_t kind, int api, int device, int result, uint64_t ptr,
                        uint64_t bytes, uint32_t lib, const char *text);
SD_HIDDEN void sd_audit_event(uint32_t kind, uint32_t obj, uint32_t obj2, uint32_t flag,
                              const char *text);
SD_HIDDEN uint32_t sd_lib_index_slow(void *caller, unsigned bucket, uint64_t addr);
/* return address -> calling library index: a direct-mapped cache of packed (address,
 * index) words; a hit is one relaxed load, inline on every allocation (issue 13); dladdr
 * only the first time a call site is seen (registry.c) */
SD_HIDDEN extern uint64_t sd_lib_cache[256];
static inline uint32_t sd_lib_index(void *caller)
{
    uint64_t addr = (uint64_t)(uintptr_t)caller & 0xFFFFFFFFFFFFull;
    unsigned bucket = (unsigned)((addr >> 4) ^ (addr >> 12)) & 255u;
    uint64_t e = __atomic_load_n(&sd_lib_cache[bucket], __ATOMIC_RELAXED);
    if (SD_LIKELY((e >> 16) == addr && e))
        return (uint32_t)(e & 0xFFFF);
    return sd_lib_index_slow(caller, bucket, addr);
}
SD_HIDDEN int sd_record_insert(uint64_t key, uint64_t size, int device, int api, uint32_t lib);
SD_HIDDEN int sd_record_take(uint64_t key, uint64_t *size, int *device);
SD_HIDDEN int sd_record_find(uint64_t key);
SD_HIDDEN uint64_t sd_now_ns(int clock);
SD_HIDDEN uint64_t sd_parse_size(const char *s, int *ok);
SD_HIDDEN void sd_registry_lock(void);
SD_HIDDEN void sd_registry_unlock(void);

/* device.c */
SD_HIDDEN void sd_device_resolve(void);
SD_HIDDEN int sd_device_visible(CUdevice dev);
SD_HIDDEN int sd_logical_to_physical(int ordinal);
/* on every allocation: inline (issue 13) */
static inline int sd_current_device(void)
{
    CUresult (*get)(CUdevice *) = (CUresult(*)(CUdevice *))sd_real(SD_HOOK_cuCtxGetDevice);
    CUdevice dev;
    if (!get || get(&dev) != CUDA_SUCCESS || dev < 0 || dev >= SD_MAX_DEVICES)
        return -1;
    return dev;
}

/* accounting helpers shared by memory.c and device.c */
static inline void sd_count_call(int api)
{
    if (sd_slot)
        __atomic_fetch_add(&sd_slot->api_calls[api], 1, __ATOMIC_RELAXED);
}

#endif
