/* config.h: the configuration, read once from the environment (config.c), and the state
 * start-up (init.c) leaves for every wrapper to read. */
#ifndef SD_CONFIG_H
#define SD_CONFIG_H

#include <stdint.h>

#include "common.h"

/* The configuration, read once from the environment in the constructor (before main):
 * a program that changes SEEDANCE_* later (unsetenv("SEEDANCE_MEM_LIMIT"),
 * setenv("SEEDANCE_DISABLE", "1")) before its first CUDA call changes nothing.
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

#endif
