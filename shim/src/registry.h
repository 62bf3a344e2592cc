/* registry.h: the shared registry (registry.c): this process's slot and group, the event
 * ring (notes included), the allocation records, the calling-library cache. */
#ifndef SD_REGISTRY_H
#define SD_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"

SD_HIDDEN extern struct sd_slot *sd_slot;
SD_HIDDEN extern struct sd_group *sd_group;
SD_HIDDEN extern struct sd_header *sd_registry;
/* a note: an event in the ring, and a line on stderr with SEEDANCE_VERBOSE=1 (sd_warn: always) */
SD_HIDDEN void sd_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
SD_HIDDEN void sd_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
SD_HIDDEN void sd_say(const char *text); /* one line on stderr, whatever SEEDANCE_VERBOSE says */

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
 * index) words; a hit is one relaxed load, inline on every allocation; dladdr
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

/* accounting helpers shared by memory.c and device.c */
static inline void sd_count_call(int api)
{
    if (sd_slot)
        __atomic_fetch_add(&sd_slot->api_calls[api], 1, __ATOMIC_RELAXED);
}

#endif
