/*
 * init.c: start-up (pthread_once), the configuration read once from the environment,
 * the version check, fork handling and exit.
 *
 * Environment (set by `seedance run`; documented in docs/shim.md), read ONCE, by the
 * constructor before main (struct sd_config), so the program cannot change it later:
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
struct sd_config sd_cfg;
static pthread_once_t sd_once = PTHREAD_ONCE_INIT;
static pthread_once_t sd_config_once = PTHREAD_ONCE_INIT;

static int env_is(const char *name, const char *value)
{
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

static void env_copy(const char *name, char *out, size_t len)
{
    const char *v = getenv(name);
    snprintf(out, len, "%s", v ? v : "");
}

static void read_config_once(void)
{
    sd_cfg.disable = env_is("SEEDANCE_DISABLE", "1");
    sd_cfg.verbose = env_is("SEEDANCE_VERBOSE", "1");
    sd_cfg.events = env_is("SEEDANCE_EVENTS", "1");
    sd_cfg.follow = env_is("SEEDANCE_FOLLOW", "1");
    sd_cfg.own_handles = env_is("SEEDANCE_HANDLES", "per-instance");
    const char *owner = getenv("SEEDANCE_GROUP_OWNER");
    sd_cfg.owner_pid = owner ? atoi(owner) : 0;
    const char *key = getenv("SEEDANCE_GROUP");
    sd_cfg.group_key = key && *key ? strtoull(key, NULL, 16) : 0;
    env_copy("SEEDANCE_SHIM_VERSION", sd_cfg.version, sizeof sd_cfg.version);
    env_copy("SEEDANCE_MEM_LIMIT", sd_cfg.mem_limit, sizeof sd_cfg.mem_limit);
    env_copy("SEEDANCE_AFFINITY", sd_cfg.affinity, sizeof sd_cfg.affinity);
    env_copy("SEEDANCE_RUNTIME_DIR", sd_cfg.runtime_dir, sizeof sd_cfg.runtime_dir);
    env_copy("XDG_RUNTIME_DIR", sd_cfg.xdg_runtime, sizeof sd_cfg.xdg_runtime);
    env_copy("HOME", sd_cfg.home, sizeof sd_cfg.home);
#ifdef SEEDANCE_TEST_HOOKS
    const char *hold = getenv("SEEDANCE_TEST_HOLD_LOCK_MS");
    sd_cfg.hold_lock_ms = hold ? atoi(hold) : 0;
#endif
}

/* Normally called by the constructor, before main; also by sd_init, in case another
 * library's constructor makes a CUDA call before ours has run. */
void sd_read_config(void)
{
    pthread_once(&sd_config_once, read_config_once);
}

/* One line on stderr, whatever SEEDANCE_VERBOSE says (the application's stdout is never
 * touched): for what silently changes what the process gets (disable, full registry). */
static void sd_say(const char *text)
{
    char line[SD_EVENT_TEXT + 48];
    int len = snprintf(line, sizeof line, "seedance-shim[%d]: %s\n", (int)getpid(), text);
    if (len > 0 && write(2, line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1) < 0) {
        /* nothing useful to do when stderr is closed */
    }
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
    if (sd_cfg.verbose)
        sd_say(buf);
}

void sd_warn(const char *fmt, ...)
{
    char buf[SD_EVENT_TEXT];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    sd_event(SD_EV_NOTE, -1, -1, 0, 0, 0, 0, buf);
    sd_say(buf);
}

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
    /* An inherited SEEDANCE_DISABLE=1 drops quota and affinity: never silently (issue 10).
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
