/*
 * init.c: start-up (pthread_once), the version check, fork handling and exit.
 *
 * Environment (set by `seedance run`; documented in docs/shim.md), read ONCE (config.c), by
 * the constructor before main (struct sd_config), so the program cannot change it later:
 *   SEEDANCE_DISABLE=1        bypass: every wrapper forwards untouched
 *   SEEDANCE_SHIM_VERSION     the version `seedance run` expects; a mismatch passes through
 *   SEEDANCE_AFFINITY         devices the process may see (device.c)
 *   SEEDANCE_GROUP, SEEDANCE_MEM_LIMIT   shared quota (registry.c)
 *   SEEDANCE_EVENTS=1         also put every allocation/free in the event ring
 *   SEEDANCE_FOLLOW=1         children inherit the preload (else it is stripped)
 *   SEEDANCE_VERBOSE=1        notes to stderr (never stdout)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "init.h"
#include "registry.h"

static pthread_once_t sd_once = PTHREAD_ONCE_INIT;

static void sd_do_init(void)
{
    sd_read_config();
    if (sd_cfg.disable) {
        __atomic_store_n(&sd_mode, SD_MODE_PASSTHROUGH, __ATOMIC_RELEASE);
        return;
    }
    char mine[64];
    snprintf(mine, sizeof mine, "%s+abi%d", SD_VERSION_STRING, SD_ABI_VERSION);
    if (sd_cfg.version[0] && strcmp(sd_cfg.version, mine) != 0) {
        sd_cfg.verbose = 1;
        sd_note("libseedance_shim.so is %s but seedance expects %s: passing through "
                "(reinstall seedance so both match)", mine, sd_cfg.version);
        __atomic_store_n(&sd_mode, SD_MODE_PASSTHROUGH, __ATOMIC_RELEASE);
        return;
    }
    sd_events_on = sd_cfg.events;
    sd_own_handles = sd_cfg.own_handles;
    sd_registry_attach();  /* falls back to process-local state; never fails the app */
    sd_event(SD_EV_INIT, -1, -1, 0, 0, 0, 0, mine);
    __atomic_store_n(&sd_mode, SD_MODE_ACTIVE, __ATOMIC_RELEASE);
}

void sd_init(void)
{
    pthread_once(&sd_once, sd_do_init);
}

SD_EXPORT uint32_t seedance_shim_abi_version(void)
{
    return SD_ABI_VERSION;
}

SD_EXPORT const char *seedance_shim_version_string(void)
{
    return SD_VERSION_STRING;
}

/* A forked child is a new instance: with --follow-children it gets its own slot on its
 * next CUDA call; otherwise it runs unwrapped (and must never touch the parent's slot).
 * Only the forking thread exists here, so resetting the once-control is safe. */
static void sd_atfork_child(void)
{
    sd_slot = NULL;
    sd_registry_after_fork();
    if (sd_cfg.follow && !sd_is_audit) {
        sd_once = (pthread_once_t)PTHREAD_ONCE_INIT;
        __atomic_store_n(&sd_mode, SD_MODE_UNINIT, __ATOMIC_RELEASE);
    } else {
        __atomic_store_n(&sd_mode, SD_MODE_PASSTHROUGH, __ATOMIC_RELEASE);
    }
}

static int sd_in_base_namespace(void)
{
    Dl_info info;
    struct link_map *map = NULL;
    Lmid_t lmid = LM_ID_BASE;
    if (dladdr1((void *)&sd_in_base_namespace, &info, (void **)&map, RTLD_DL_LINKMAP) && map)
        if (dlinfo(map, RTLD_DI_LMID, &lmid) == 0)
            return lmid == LM_ID_BASE;
    return 1;
}

/* Remove our own entries from LD_PRELOAD / LD_AUDIT so that programs this process
 * execs run unwrapped (children are followed only with --follow-children).  Done in
 * the constructor, before main() and before any interpreter copies environ. */
static void sd_strip_env(const char *var)
{
    const char *value = getenv(var);
    if (!value || !strstr(value, "libseedance_shim"))
        return;
    char out[4096];
    size_t used = 0;
    const char *p = value;
    while (*p) {
        size_t len = strcspn(p, ": ");
        if (len && !(len >= 19 && memmem(p, len, "libseedance_shim", 16))) {
            if (used && used < sizeof out - 1)
                out[used++] = ':';
            if (used + len < sizeof out) {
                memcpy(out + used, p, len);
                used += len;
            }
        }
        p += len;
        if (*p)
            p++;
    }
    out[used < sizeof out ? used : sizeof out - 1] = '\0';
    if (used)
        setenv(var, out, 1);
    else
        unsetenv(var);
}

__attribute__((constructor)) static void sd_constructor(void)
{
    sd_read_config();
    if (!sd_in_base_namespace()) {
        sd_is_audit = 1;
        return;
    }
    /* preloaded, or dlopened by a reader of the registry (the Python binding)? */
    const char *preload = getenv("LD_PRELOAD");
    int preloaded = preload && strstr(preload, "libseedance_shim");
    if (!sd_cfg.follow) {
        sd_strip_env("LD_PRELOAD");
        sd_strip_env("LD_AUDIT");
    }
    /* An inherited SEEDANCE_DISABLE=1 drops quota and affinity: never silently.
     * `seedance run` says so itself for the program it starts (its direct child). */
    if (preloaded && sd_cfg.disable && !(sd_cfg.owner_pid && sd_cfg.owner_pid == (int)getppid()))
        sd_say(sd_cfg.mem_limit[0] || sd_cfg.affinity[0]
                   ? "SEEDANCE_DISABLE=1 is set: the shim passes every call through, so the "
                     "memory quota and device affinity are NOT enforced"
                   : "SEEDANCE_DISABLE=1 is set: the shim passes every call through");
    pthread_atfork(NULL, NULL, sd_atfork_child);
}

__attribute__((destructor)) static void sd_destructor(void)
{
    if (__atomic_load_n(&sd_mode, __ATOMIC_ACQUIRE) == SD_MODE_ACTIVE)
        sd_registry_detach_at_exit();
}
