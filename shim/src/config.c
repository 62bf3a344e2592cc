/*
 * config.c: the configuration, read ONCE from the environment (struct sd_config), by the
 * constructor before main (init.c) or by the first CUDA call, whichever comes first, so the
 * program cannot change it later; and the state start-up leaves for the wrappers.
 * init.c lists the variables.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int sd_mode = SD_MODE_UNINIT;
int sd_events_on;
int sd_own_handles;
int sd_is_audit;
struct sd_config sd_cfg;
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
