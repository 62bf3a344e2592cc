/*
 * init.c: start-up (pthread_once), the configuration read once from the environment,
 * the version check, fork handling and exit.
 *
 * Environment (set by `seedance run`; documented in docs/shim.md):
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
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shim.h"

int sd_mode = SD_MODE_UNINIT;
int sd_events_on;
int sd_own_handles;
int sd_is_audit;
static int sd_follow;
static int sd_verbose;
static pthread_once_t sd_once = PTHREAD_ONCE_INIT;

static int env_is(const char *name, const char *value)
{
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

void sd_note(const char *fmt, ...)
{
    char buf[SD_EVENT_TEXT];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    sd_event(SD_EV_NOTE, -1, -1, 0, 0, 0, 0, buf);
    if (sd_verbose) {
        /* stderr only: the application's stdout is never touched */
        char line[SD_EVENT_TEXT + 32];
        int len = snprintf(line, sizeof line, "seedance-shim[%d]: %s\n", (int)getpid(), buf);
        if (len > 0 && write(2, line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1) < 0) {
            /* nothing useful to do when stderr is closed */
        }
    }
}

static void sd_do_init(void)
{
    sd_verbose = env_is("SEEDANCE_VERBOSE", "1");
    if (env_is("SEEDANCE_DISABLE", "1")) {
        __atomic_store_n(&sd_mode, SD_MODE_PASSTHROUGH, __ATOMIC_RELEASE);
        return;
    }
    const char *want = getenv("SEEDANCE_SHIM_VERSION");
    char mine[64];
    snprintf(mine, sizeof mine, "%s+abi%d", SD_VERSION_STRING, SD_ABI_VERSION);
    if (want && *want && strcmp(want, mine) != 0) {
        sd_verbose = 1;
        sd_note("libseedance_shim.so is %s but seedance expects %s: passing through "
                "(reinstall seedance so both match)", mine, want);
        __atomic_store_n(&sd_mode, SD_MODE_PASSTHROUGH, __ATOMIC_RELEASE);
        return;
    }
    sd_events_on = env_is("SEEDANCE_EVENTS", "1");
    sd_follow = env_is("SEEDANCE_FOLLOW", "1");
    sd_own_handles = env_is("SEEDANCE_HANDLES", "per-instance");
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
    if (sd_follow && !sd_is_audit) {
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
    if (!sd_in_base_namespace()) {
        sd_is_audit = 1;
        return;
    }
    sd_follow = env_is("SEEDANCE_FOLLOW", "1");
    if (!sd_follow) {
        sd_strip_env("LD_PRELOAD");
        sd_strip_env("LD_AUDIT");
    }
    pthread_atfork(NULL, NULL, sd_atfork_child);
}

__attribute__((destructor)) static void sd_destructor(void)
{
    if (__atomic_load_n(&sd_mode, __ATOMIC_ACQUIRE) == SD_MODE_ACTIVE)
        sd_registry_detach_at_exit();
}
