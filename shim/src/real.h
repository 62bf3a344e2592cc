/* real.h: the hooks' table and the real functions behind them (real.c): how the shim finds
 * the driver's and the runtime's own entry points without ever loading either. */
#ifndef SD_REAL_H
#define SD_REAL_H

#include "common.h"

struct sd_hook_info {
    const char *name;      /* exported symbol */
    const char *proc;      /* cuGetProcAddress symbol */
    int since;             /* first cudaVersion that gets this entry point */
    int flags;
    int wrapped;           /* 0 for DRIVER entries */
};
SD_HIDDEN extern const struct sd_hook_info sd_hooks[SD_HOOK_COUNT];

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

/* the loader's own dlsym (found once, by sd_resolve_next_dlsym), and the driver if loaded */
SD_HIDDEN extern void *(*sd_next_dlsym)(void *, const char *);
SD_HIDDEN void sd_resolve_next_dlsym(void);
SD_HIDDEN void *sd_real_dlsym(void *handle, const char *name);
SD_HIDDEN void *sd_driver_handle(void);

#endif
