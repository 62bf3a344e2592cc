/*
 * seedance_shim.h: the shared-state layout of libseedance_shim.so.
 *
 * One file, two readers: the C shim includes it, and shim/build_shim.py hands the
 * region between the cdef markers to cffi as its cdef, so Python reads the registry
 * through exactly these structs (no second, hand-synced description of the layout).
 * Only what cffi's cdef parser accepts goes between the markers: plain structs,
 * integer #defines and prototypes.
 *
 * The registry is one mmap'd file per user ($XDG_RUNTIME_DIR/seedance/registry.v<ABI>):
 *   sd_header | sd_group[SD_MAX_GROUPS] | sd_slot[SD_MAX_SLOTS]
 * Counters are updated with the GCC __atomic builtins; readers tolerate torn reads of
 * records that are being written (they only ever report, never decide, from them).
 */
#ifndef SEEDANCE_SHIM_H
#define SEEDANCE_SHIM_H

#include <stdint.h>
#include <stddef.h>

/* cdef-begin */
#define SD_ABI_VERSION 4
#define SD_MAGIC 0x3147455244454553   /* "SEEDREG1" little-endian */
#define SD_MAX_SLOTS 256
#define SD_MAX_GROUPS 64
#define SD_MAX_OVERFLOW 64
#define SD_MAX_DEVICES 16
#define SD_MAX_APIS 48
#define SD_API_NAME_LEN 32
#define SD_MAX_RECORDS 8192
#define SD_MAX_LIBS 64
#define SD_LIB_PATH_LEN 248
#define SD_RING_EVENTS 2048
#define SD_EVENT_TEXT 192
/* the initial pid namespace's inode (PROC_PID_INIT_INO, include/linux/proc_ns.h): a reader
 * there sees every process of every pid namespace in its /proc */
#define SD_INIT_PID_NS_INO 0xEFFFFFFC

/* sd_slot.state */
#define SD_SLOT_FREE 0
#define SD_SLOT_CLAIMING 1
#define SD_SLOT_LIVE 2
#define SD_SLOT_EXITED 3

/* sd_record.ptr: an empty bucket is 0, a freed one is SD_RECORD_TOMBSTONE.
 * cuMemCreate handles are stored with SD_HANDLE_TAG set so that they can never be
 * confused with a device pointer (user-space addresses never have bit 63 set). */
#define SD_RECORD_TOMBSTONE 1
#define SD_HANDLE_TAG 0x8000000000000000

/* sd_event.kind */
#define SD_EV_INIT 1
#define SD_EV_ALLOC 2
#define SD_EV_FREE 3
#define SD_EV_QUOTA_REFUSED 4
#define SD_EV_REMAP 5
#define SD_EV_NOTE 6
#define SD_EV_CONTEXT 7
#define SD_EV_LAUNCH 8     /* a kernel or graph launch: api, lib, result */
#define SD_EV_OBJSEARCH 16
#define SD_EV_OBJOPEN 17
#define SD_EV_SYMBIND 18
#define SD_EV_EXIT 19

struct sd_record {
    uint64_t ptr;         /* device pointer, or handle | SD_HANDLE_TAG; 0 empty, 1 freed */
    uint64_t size;
    int32_t device;       /* physical device ordinal (driver numbering) */
    uint16_t api;         /* hook index: names in sd_header.api_names */
    uint16_t lib;         /* index into sd_slot.libs: the calling library */
};

struct sd_lib {
    uint32_t ready;       /* set last: the path is complete */
    uint32_t pad;
    uint64_t allocs;      /* allocations this library made */
    char path[SD_LIB_PATH_LEN];
};

struct sd_event {
    uint64_t seq;         /* ring index + 1 once the event is complete (publication) */
    uint64_t time_ns;     /* CLOCK_MONOTONIC */
    uint32_t kind;        /* SD_EV_* */
    uint32_t api;         /* hook index */
    int32_t device;       /* physical device, -1 when none */
    int32_t result;       /* CUresult of the call */
    uint64_t ptr;
    uint64_t bytes;
    uint32_t lib;         /* calling library index */
    uint32_t obj;         /* audit: object number of the loaded/binding object */
    uint32_t obj2;        /* audit symbind: object number that defines the symbol */
    uint32_t flag;        /* audit: la_objsearch source (LA_SER_*), objopen lmid */
    char text[SD_EVENT_TEXT];
};

/* A member of a group that found every slot taken (registry full): it shares the group's
 * quota like any member, but its allocations are recorded only inside the process. */
struct sd_overflow {
    int32_t pid;                       /* 0 free; claimed by CAS; in its own pid namespace */
    uint32_t pad;
    uint64_t start_time;
    uint64_t pid_ns_dev;               /* stat(/proc/self/ns/pid) of the member: st_dev, st_ino */
    uint64_t pid_ns_ino;
};

struct sd_group {
    uint64_t key;                      /* 0 free; set last when created */
    int32_t owner_pid;                 /* in the owner's pid namespace (owner_ns_*) */
    uint32_t members;                  /* live processes attached: slots and overflow[] entries */
    uint64_t owner_start;
    uint64_t owner_ns_dev;
    uint64_t owner_ns_ino;
    uint64_t slot_bits[SD_MAX_SLOTS / 64];  /* the slots of this group's members: readers
                                          touch only those (set when a slot joins, cleared
                                          when it is reclaimed) */
    uint32_t overflow_total;           /* processes that joined without a slot (registry full) */
    uint32_t overflow_refused;         /* ... and found overflow[] full too: their quota'd
                                          allocations were all refused */
    struct sd_overflow overflow[SD_MAX_OVERFLOW];
    uint64_t limit[SD_MAX_DEVICES];    /* bytes per physical device; 0 = no quota */
    uint64_t used[SD_MAX_DEVICES];     /* reserved before the real allocation */
    uint64_t refused[SD_MAX_DEVICES];  /* allocations refused by the quota */
    uint64_t peak[SD_MAX_DEVICES];     /* highest reservation seen, all members together */
};

struct sd_slot {
    uint32_t state;                    /* SD_SLOT_* */
    int32_t pid;                       /* as the process sees it: in its own pid namespace */
    uint64_t start_time;               /* /proc/self/stat field 22, clock ticks since boot:
                                          the same number in every pid namespace */
    uint64_t pid_ns_dev;               /* stat(/proc/self/ns/pid): st_dev and st_ino name the
                                          pid namespace, so a reader in another one (the host
                                          agent, a container) can find the process (through
                                          NSpid in /proc/PID/status) instead of judging by
                                          whoever has that number in its own */
    uint64_t pid_ns_ino;
    int32_t ppid;                      /* in the same pid namespace as pid; 0 outside it */
    int32_t group;                     /* index into the group table, -1 none */
    uint64_t started_ns;               /* CLOCK_REALTIME */
    uint64_t exited_ns;
    char exe[128];
    int32_t nvisible;                  /* -1: no remap; else logical 0..n-1 -> visible[] */
    int32_t visible[SD_MAX_DEVICES];
    int32_t ndevices;                  /* what the driver reported before the remap */
    uint32_t flags;                    /* 1 audit attached, 2 events enabled, 4 follow children */
    uint64_t cur[SD_MAX_DEVICES];      /* bytes held per physical device, summed from the
                                          records when the instance ends (not on the hot
                                          path: readers sum the records of a live one) */
    uint64_t refused[SD_MAX_DEVICES];
    uint64_t contexts[SD_MAX_DEVICES];
    uint64_t api_calls[SD_MAX_APIS];   /* successful calls per hook */
    uint64_t untracked;                /* allocations the record table had no room for */
    uint32_t nlibs;
    uint32_t nobjs;                    /* audit object numbers handed out */
    struct sd_lib libs[SD_MAX_LIBS];
    uint64_t ring_head;                /* next event index to write */
    uint64_t ring_tail;                /* next event index the drainer reads */
    uint64_t ring_dropped;
    struct sd_event ring[SD_RING_EVENTS];
    struct sd_record records[SD_MAX_RECORDS];
};

struct sd_header {
    uint64_t magic;
    uint32_t abi_version;
    uint32_t header_size;
    uint32_t slot_size;
    uint32_t group_size;
    uint32_t max_slots;
    uint32_t max_groups;
    uint32_t napis;
    uint32_t ready;                    /* set last by the creator */
    uint64_t created_ns;
    uint8_t lock[64];                  /* robust process-shared pthread mutex: dies with its holder */
    char api_names[SD_MAX_APIS][SD_API_NAME_LEN];
    uint8_t reserved[2048];
};

/* Exported helpers (the Python binding calls these through cffi; the rules live in C
 * once).  All return 0 / a non-negative index on success, -errno on failure. */
uint32_t seedance_shim_abi_version(void);
const char *seedance_shim_version_string(void);
int seedance_registry_path(char *buf, size_t len);
int seedance_registry_reclaim(void *base, int slot);
int seedance_registry_slot_dead(void *base, int slot);
int seedance_pid_ns(uint64_t *dev, uint64_t *ino);
int seedance_group_open(void *base, uint64_t key, const uint64_t *limits, int ndev);
int seedance_group_release(void *base, int group);
int seedance_group_slots(void *base, int group, int *out, int max);
int seedance_group_find(void *base, uint64_t key);
int seedance_slot_held(void *base, int slot, uint64_t *held);
uint64_t seedance_proc_start_time(int pid);
size_t seedance_registry_size(void);
struct sd_slot *seedance_registry_slot_ptr(void *base, int slot);
struct sd_group *seedance_registry_group_ptr(void *base, int group);
/* cdef-end */

#endif
