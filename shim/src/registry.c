/*
 * registry.c: the shared, versioned, mmap'd registry of instances, the per-allocation
 * records, the per-process event ring and the quota groups.
 *
 * Concurrency rules (why the hot path never blocks):
 *  - claiming a slot is one CAS on sd_slot.state (no lock: 200 processes starting at
 *    once never queue behind each other);
 *  - quota reservation is a CAS loop on sd_group.used[dev];
 *  - records live in a per-slot open-addressing table, claimed by CAS on the key;
 *  - events go into a per-slot ring: fetch_add reserves an index, seq publishes it;
 *    writers never wait for the reader (a lapped reader counts drops).
 *  - The one lock (a robust, process-shared mutex in the header) guards only rare
 *    structural changes: creating a group and reclaiming a dead slot.  A holder that
 *    is SIGKILLed makes the next locker see EOWNERDEAD and carry on; both changes are
 *    published by a final store, so a half-done change is invisible.
 *  - The file is created under flock (released by the kernel if the creator dies).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "real.h"
#include "registry.h"

struct sd_header *sd_registry;
struct sd_slot *sd_slot;
struct sd_group *sd_group;
static size_t sd_registry_size;

/* Used when no registry can be opened (read-only home, no runtime dir): the process
 * still gets its remap and quota, only nobody else can see them. */
static struct sd_slot sd_local_slot;
static struct sd_group sd_local_group;

#define SD_HEADER_BYTES ((sizeof(struct sd_header) + 4095) & ~(size_t)4095)
#define SD_GROUPS_BYTES ((sizeof(struct sd_group) * SD_MAX_GROUPS + 4095) & ~(size_t)4095)
#define SD_SLOT_BYTES ((sizeof(struct sd_slot) + 4095) & ~(size_t)4095)

static inline struct sd_group *group_at(void *base, int i)
{
    return (struct sd_group *)((char *)base + SD_HEADER_BYTES) + i;
}

static inline struct sd_slot *slot_at(void *base, int i)
{
    return (struct sd_slot *)((char *)base + SD_HEADER_BYTES + SD_GROUPS_BYTES + (size_t)i * SD_SLOT_BYTES);
}

SD_EXPORT size_t seedance_registry_size(void)
{
    return SD_HEADER_BYTES + SD_GROUPS_BYTES + SD_SLOT_BYTES * SD_MAX_SLOTS;
}

SD_EXPORT struct sd_slot *seedance_registry_slot_ptr(void *base, int i)
{
    return (base && i >= 0 && i < SD_MAX_SLOTS) ? slot_at(base, i) : NULL;
}

SD_EXPORT struct sd_group *seedance_registry_group_ptr(void *base, int i)
{
    return (base && i >= 0 && i < SD_MAX_GROUPS) ? group_at(base, i) : NULL;
}

uint64_t sd_now_ns(int clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* size with K/M/G/T suffix (binary); ok=0 on garbage */
uint64_t sd_parse_size(const char *s, int *ok)
{
    char *end;
    *ok = 0;
    if (!s || !*s)
        return 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s)
        return 0;
    uint64_t mult = 1;
    switch (*end) {
    case 'k': case 'K': mult = 1ull << 10; end++; break;
    case 'm': case 'M': mult = 1ull << 20; end++; break;
    case 'g': case 'G': mult = 1ull << 30; end++; break;
    case 't': case 'T': mult = 1ull << 40; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'I')
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end != '\0')
        return 0;
    *ok = 1;
    return (uint64_t)v * mult;
}

/* field 22 (starttime) of a /proc/.../stat file */
static uint64_t start_time_at(const char *path)
{
    char buf[1024];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    p += 2; /* field 3, state */
    for (int field = 3; field < 22 && *p; field++) {
        p = strchr(p, ' ');
        if (!p)
            return 0;
        p++;
    }
    return strtoull(p, NULL, 10);
}

/* /proc/PID/stat field 22 (starttime): with the pid, an identity that survives pid reuse.
 * It counts clock ticks since boot, so a process has the same start time whichever pid
 * namespace's /proc it is read through (fs/proc/array.c: do_task_stat). */
SD_EXPORT uint64_t seedance_proc_start_time(int pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    return start_time_at(path);
}

/* This process's own start time: /proc/self, not /proc/getpid(), which is another process
 * when /proc belongs to a parent pid namespace (unshare --pid without --mount-proc). */
static uint64_t self_start_time(void)
{
    return start_time_at("/proc/self/stat");
}

/* The pid namespace this process is in: the st_dev and st_ino of /proc/self/ns/pid
 * (namespaces(7): two processes are in the same namespace iff both numbers match). */
SD_EXPORT int seedance_pid_ns(uint64_t *dev, uint64_t *ino)
{
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) != 0) {
        *dev = *ino = 0;
        return -errno;
    }
    *dev = (uint64_t)st.st_dev;
    *ino = (uint64_t)st.st_ino;
    return 0;
}

static int ensure_dir(const char *path)
{
    struct stat st;
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        return -errno;
    if (lstat(path, &st) != 0)
        return -errno;
    /* a directory someone else controls could be swapped under us */
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022))
        return -EPERM;
    return 0;
}

/* The Python binding asks with the current environment; the shim with the one its
 * constructor saw (sd_cfg), so a program cannot move its registry after start. */
SD_EXPORT int seedance_registry_path(char *buf, size_t len)
{
    return sd_registry_path_in(getenv("SEEDANCE_RUNTIME_DIR"), getenv("XDG_RUNTIME_DIR"), getenv("HOME"), buf, len);
}

int sd_registry_path_in(const char *dir, const char *xdg, const char *home, char *buf, size_t len)
{
    char d[512];
    int rc;
    if (dir && *dir) {
        snprintf(d, sizeof d, "%s", dir);
        if ((rc = ensure_dir(d)) < 0)
            return rc;
    } else if (xdg && *xdg) {
        snprintf(d, sizeof d, "%s/seedance", xdg);
        if ((rc = ensure_dir(d)) < 0)
            return rc;
    } else if (home && *home) {
        /* ~/.local/state/seedance/run; the parents may legitimately be 0755 */
        const char *parts[] = {"/.local", "/.local/state", "/.local/state/seedance"};
        for (int i = 0; i < 3; i++) {
            snprintf(d, sizeof d, "%s%s", home, parts[i]);
            if (mkdir(d, 0700) != 0 && errno != EEXIST)
                return -errno;
        }
        snprintf(d, sizeof d, "%s/.local/state/seedance/run", home);
        if ((rc = ensure_dir(d)) < 0)
            return rc;
    } else {
        return -ENOENT;
    }
    if ((size_t)snprintf(buf, len, "%s/registry.v%d", d, SD_ABI_VERSION) >= len)
        return -ENAMETOOLONG;
    return 0;
}

static void init_header(struct sd_header *h)
{
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init((pthread_mutex_t *)h->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    h->abi_version = SD_ABI_VERSION;
    h->header_size = sizeof(struct sd_header);
    h->slot_size = sizeof(struct sd_slot);
    h->group_size = sizeof(struct sd_group);
    h->max_slots = SD_MAX_SLOTS;
    h->max_groups = SD_MAX_GROUPS;
    h->napis = SD_HOOK_COUNT;
    h->created_ns = sd_now_ns(CLOCK_REALTIME);
    for (int i = 0; i < SD_HOOK_COUNT; i++)
        snprintf(h->api_names[i], SD_API_NAME_LEN, "%s", sd_hooks[i].name);
    __atomic_store_n(&h->magic, (uint64_t)SD_MAGIC, __ATOMIC_RELEASE);
    __atomic_store_n(&h->ready, 1, __ATOMIC_RELEASE);
}

static int header_compatible(const struct sd_header *h)
{
    return h->magic == (uint64_t)SD_MAGIC && h->abi_version == SD_ABI_VERSION &&
           h->slot_size == sizeof(struct sd_slot) && h->group_size == sizeof(struct sd_group) &&
           h->max_slots == SD_MAX_SLOTS && h->max_groups == SD_MAX_GROUPS;
}

static struct sd_header *map_registry(void)
{
    char path[600];
    int rc = sd_registry_path_in(sd_cfg.runtime_dir, sd_cfg.xdg_runtime, sd_cfg.home, path, sizeof path);
    if (rc < 0) {
        sd_note("no registry directory (%s): process-local accounting", strerror(-rc));
        return NULL;
    }
    size_t size = seedance_registry_size();
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        sd_note("cannot open %s (%s): process-local accounting", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077)) {
        sd_note("%s is not private to this user: process-local accounting", path);
        close(fd);
        return NULL;
    }
    if ((size_t)st.st_size < size && ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        return NULL;
    }
    void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    struct sd_header *h = base;
    if (!__atomic_load_n(&h->ready, __ATOMIC_ACQUIRE)) {
        /* first user ever: create under flock (the kernel drops it if we die) */
        if (flock(fd, LOCK_EX) == 0) {
            if (!__atomic_load_n(&h->ready, __ATOMIC_ACQUIRE))
                init_header(h);
            flock(fd, LOCK_UN);
        }
    }
    close(fd);
    if (!header_compatible(h)) {
        sd_note("%s has another layout (ABI %u): process-local accounting", path, h->abi_version);
        munmap(base, size);
        return NULL;
    }
    sd_registry_size = size;
    return h;
}

static void lock_header(struct sd_header *h)
{
    int rc = pthread_mutex_lock((pthread_mutex_t *)h->lock);
    if (rc == EOWNERDEAD) /* the holder died: every change it made is published last, or not at all */
        pthread_mutex_consistent((pthread_mutex_t *)h->lock);
}

static void unlock_header(struct sd_header *h)
{
    pthread_mutex_unlock((pthread_mutex_t *)h->lock);
}

void sd_registry_lock(void)
{
    if (sd_registry)
        lock_header(sd_registry);
}

void sd_registry_unlock(void)
{
    if (sd_registry)
        unlock_header(sd_registry);
}

static void overflow_sweep_locked(struct sd_group *g);

/* pid and start time in this process's own pid namespace */
static int local_pid_alive(int pid, uint64_t start)
{
    if (pid <= 0)
        return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 0;
    uint64_t now = seedance_proc_start_time(pid);
    return now == 0 || now == start; /* unreadable /proc (hidepid): assume alive */
}

/* The last number of the NSpid line of /proc/PID/status: the pid in the process's own
 * (innermost) pid namespace; -1 when unreadable. */
static int innermost_pid(const char *pid_dir)
{
    char path[320], buf[4096];
    snprintf(path, sizeof path, "/proc/%s/status", pid_dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *line = strstr(buf, "\nNSpid:");
    if (!line)
        return -1;
    int last = -1;
    for (char *p = line + 7; *p && *p != '\n';) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p)
            break;
        last = (int)v;
        p = end;
    }
    return last;
}

/* A process of another pid namespace (a container's, seen from the host): look for it in
 * /proc, where the host sees every process of every namespace below its own.  Alive when
 * a process in that namespace has that innermost pid and that start time.  Dead when it is
 * not there and the namespace is visible here (another of its processes is) or this reader
 * is in the initial pid namespace (which sees all of them: a namespace with no process
 * left has ended).  Otherwise this reader cannot see that namespace at all (a container
 * looking at the host's slots, or a sibling's) and never declares the process ended; nor
 * when a process with that innermost pid and start time hid its namespace from us.  A walk of
 * /proc, on the rare paths only: a full registry, a reclaim. */
static int foreign_pid_alive(int pid, uint64_t start, uint64_t ns_dev, uint64_t ns_ino, uint64_t own_ino)
{
    DIR *proc = opendir("/proc");
    if (!proc)
        return 1;
    int seen_ns = 0, hidden = 0, alive = 0;
    struct dirent *d;
    while (!alive && !hidden && (d = readdir(proc)) != NULL) {
        if (!isdigit((unsigned char)d->d_name[0]))
            continue;
        char path[320]; /* d_name is at most 255 bytes */
        struct stat st;
        snprintf(path, sizeof path, "/proc/%s/ns/pid", d->d_name);
        if (stat(path, &st) != 0) {
            /* following the ns link needs ptrace access (proc(5)): a process that is not
             * dumpable hides its namespace, not its innermost pid or its start time, and
             * with both matching it may well be ours */
            if (errno == EACCES || errno == EPERM) {
                snprintf(path, sizeof path, "/proc/%s/stat", d->d_name);
                hidden = innermost_pid(d->d_name) == pid && start_time_at(path) == start;
            }
            continue;
        }
        if ((uint64_t)st.st_dev != ns_dev || (uint64_t)st.st_ino != ns_ino)
            continue;
        seen_ns = 1;
        if (innermost_pid(d->d_name) != pid)
            continue;
        snprintf(path, sizeof path, "/proc/%s/stat", d->d_name);
        alive = start_time_at(path) == start;
    }
    closedir(proc);
    if (alive || hidden)
        return 1;
    return !(seen_ns || own_ino == SD_INIT_PID_NS_INO);
}

/* Whether the process (pid, start) of the pid namespace (ns_dev, ns_ino) still runs, as
 * seen from this process; ns_ino 0: the namespace is not known (no /proc there), judged
 * as this process's own. */
static int pid_alive(int pid, uint64_t start, uint64_t ns_dev, uint64_t ns_ino)
{
    uint64_t own_dev, own_ino;
    if (pid <= 0)
        return 0;
    if (ns_ino == 0 || seedance_pid_ns(&own_dev, &own_ino) != 0 || (own_dev == ns_dev && own_ino == ns_ino))
        return local_pid_alive(pid, start);
    return foreign_pid_alive(pid, start, ns_dev, ns_ino, own_ino);
}

static inline int same_process(int32_t pid, uint64_t start, uint64_t ns_dev, uint64_t ns_ino,
                               int32_t pid2, uint64_t start2, uint64_t ns_dev2, uint64_t ns_ino2)
{
    return pid == pid2 && start == start2 && ns_dev == ns_dev2 && ns_ino == ns_ino2;
}

SD_EXPORT int seedance_registry_slot_dead(void *base, int i)
{
    if (i < 0 || i >= SD_MAX_SLOTS)
        return -EINVAL;
    struct sd_slot *s = slot_at(base, i);
    uint32_t state = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE);
    if (state == SD_SLOT_FREE)
        return 0;
    if (state == SD_SLOT_EXITED)
        return 1;
    return !pid_alive(s->pid, s->start_time, s->pid_ns_dev, s->pid_ns_ino);
}

/* Groups are placed from key % SD_MAX_GROUPS on, and looked up from there: a reader
 * (seedance-run after its program) then touches one group's page, not the whole table. */
static inline int group_home(uint64_t key)
{
    return (int)(key % SD_MAX_GROUPS);
}

/* Find or create the quota group `key`.  Returns its index. */
static int group_open_locked(void *base, uint64_t key, const uint64_t *limits, int ndev, int owner)
{
    int free_index = -1;
    for (int k = 0; k < SD_MAX_GROUPS; k++) {
        int i = (group_home(key) + k) % SD_MAX_GROUPS;
        struct sd_group *g = group_at(base, i);
        uint64_t found = __atomic_load_n(&g->key, __ATOMIC_ACQUIRE);
        if (found == key)
            return i;
        if (found == 0 && free_index < 0)
            free_index = i;
    }
    if (free_index < 0)
        return -ENOSPC;
    struct sd_group *g = group_at(base, free_index);
    memset((char *)g + sizeof g->key, 0, sizeof *g - sizeof g->key);
    for (int d = 0; d < ndev && d < SD_MAX_DEVICES; d++)
        g->limit[d] = limits[d];
    g->owner_pid = owner;
    g->owner_start = owner == (int)getpid() ? self_start_time() : seedance_proc_start_time(owner);
    seedance_pid_ns(&g->owner_ns_dev, &g->owner_ns_ino); /* the owner is ours or our parent */
    __atomic_store_n(&g->key, key, __ATOMIC_RELEASE);
    return free_index;
}

static int group_find(void *base, uint64_t key)
{
    for (int k = 0; k < SD_MAX_GROUPS; k++) {
        int i = (group_home(key) + k) % SD_MAX_GROUPS;
        if (__atomic_load_n(&group_at(base, i)->key, __ATOMIC_ACQUIRE) == key)
            return i;
    }
    return -1;
}

SD_EXPORT int seedance_group_find(void *base, uint64_t key)
{
    return base && key ? group_find(base, key) : -EINVAL;
}

SD_EXPORT int seedance_group_open(void *base, uint64_t key, const uint64_t *limits, int ndev)
{
    if (!base || key == 0)
        return -EINVAL;
    int i = group_find(base, key);
    if (i >= 0)
        return i;
    lock_header(base);
    i = group_open_locked(base, key, limits, ndev, (int)getpid());
    unlock_header(base);
    return i;
}

SD_EXPORT int seedance_group_release(void *base, int i)
{
    if (!base || i < 0 || i >= SD_MAX_GROUPS)
        return -EINVAL;
    struct sd_group *g = group_at(base, i);
    lock_header(base);
    overflow_sweep_locked(g);
    int busy = __atomic_load_n(&g->members, __ATOMIC_ACQUIRE) != 0;
    if (!busy)
        __atomic_store_n(&g->key, 0, __ATOMIC_RELEASE);
    unlock_header(base);
    return busy ? -EBUSY : 0;
}

/* Empty a dead slot.  Claimers only CAS a FREE state, so the slot is kept CLAIMING
 * (ours) while it is zeroed.  Past its first page the memory is handed back to the
 * file system (MADV_REMOVE on the shared mapping: zero-filled, and no tmpfs pages stay
 * allocated for a slot nobody uses); memset where that is not supported. */
static void zero_slot(struct sd_slot *s)
{
    __atomic_store_n(&s->state, SD_SLOT_CLAIMING, __ATOMIC_RELEASE);
    char *base = (char *)s;
    size_t first = 4096 < sizeof *s ? 4096 : sizeof *s;
    memset(base + sizeof s->state, 0, first - sizeof s->state);
    if (sizeof *s > first && madvise(base + first, SD_SLOT_BYTES - first, MADV_REMOVE) != 0)
        memset(base + first, 0, sizeof *s - first);
    __atomic_store_n(&s->state, SD_SLOT_FREE, __ATOMIC_RELEASE);
}

/* What a slot still holds per device: the sum of its live records. */
static void sum_records(struct sd_slot *s, uint64_t *held)
{
    memset(held, 0, sizeof(uint64_t) * SD_MAX_DEVICES);
    for (int i = 0; i < SD_MAX_RECORDS; i++) {
        uint64_t key = __atomic_load_n(&s->records[i].ptr, __ATOMIC_ACQUIRE);
        int dev = s->records[i].device;
        if (key > SD_RECORD_TOMBSTONE && dev >= 0 && dev < SD_MAX_DEVICES)
            held[dev] += s->records[i].size;
    }
}

/* Give a slot back.  A slot whose process died without reaching its destructor
 * (SIGKILL) still counts its outstanding bytes in its group: the driver freed them
 * when the process died, so they go back to the quota here. */
static int reclaim_locked(void *base, int i)
{
    struct sd_slot *s = slot_at(base, i);
    uint32_t state = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE);
    if (state == SD_SLOT_FREE)
        return 0;
    if (state != SD_SLOT_EXITED && pid_alive(s->pid, s->start_time, s->pid_ns_dev, s->pid_ns_ino))
        return -EBUSY;
    if (s->group >= 0 && s->group < SD_MAX_GROUPS) {
        struct sd_group *g = group_at(base, s->group);
        __atomic_fetch_and(&g->slot_bits[i / 64], ~(1ull << (i % 64)), __ATOMIC_ACQ_REL);
        if (state != SD_SLOT_EXITED) {
            uint64_t held[SD_MAX_DEVICES];
            sum_records(s, held);
            for (int d = 0; d < SD_MAX_DEVICES; d++)
                if (held[d])
                    __atomic_fetch_sub(&g->used[d], held[d], __ATOMIC_ACQ_REL);
            if (__atomic_load_n(&g->members, __ATOMIC_ACQUIRE))
                __atomic_fetch_sub(&g->members, 1, __ATOMIC_ACQ_REL);
        }
        /* the last member of a group whose owner (seedance run) is gone: free the group */
        overflow_sweep_locked(g);
        if (__atomic_load_n(&g->key, __ATOMIC_ACQUIRE) && !__atomic_load_n(&g->members, __ATOMIC_ACQUIRE) &&
            !pid_alive(g->owner_pid, g->owner_start, g->owner_ns_dev, g->owner_ns_ino))
            __atomic_store_n(&g->key, 0, __ATOMIC_RELEASE);
    }
    zero_slot(s);
    return 0;
}

/* For readers (seedance run after the program, the agent): the slots of one group and
 * what a slot holds, without a Python loop over every slot's every record. */
SD_EXPORT int seedance_group_slots(void *base, int group, int *out, int max)
{
    int n = 0;
    if (!base || group < 0 || group >= SD_MAX_GROUPS)
        return -EINVAL;
    struct sd_group *g = group_at(base, group);
    for (int w = 0; w < SD_MAX_SLOTS / 64; w++) {
        uint64_t bits = __atomic_load_n(&g->slot_bits[w], __ATOMIC_ACQUIRE);
        while (bits && n < max) {
            int i = w * 64 + __builtin_ctzll(bits);
            bits &= bits - 1;
            struct sd_slot *s = slot_at(base, i);
            if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != SD_SLOT_FREE && s->group == group)
                out[n++] = i;
        }
    }
    return n;
}

SD_EXPORT int seedance_slot_held(void *base, int i, uint64_t *held)
{
    if (!base || i < 0 || i >= SD_MAX_SLOTS)
        return -EINVAL;
    sum_records(slot_at(base, i), held);
    return 0;
}

SD_EXPORT int seedance_registry_reclaim(void *base, int i)
{
    if (!base || i < 0 || i >= SD_MAX_SLOTS)
        return -EINVAL;
    lock_header(base);
    int rc = reclaim_locked(base, i);
    unlock_header(base);
    return rc;
}

static void read_exe(char *out, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", out, len - 1);
    out[n > 0 ? n : 0] = '\0';
}

/* this process's pid namespace (sd_registry_attach): with pid and start time, its identity */
static uint64_t self_ns_dev, self_ns_ino;

static int claim_slot(struct sd_header *h, int pid, uint64_t start)
{
    /* the LD_AUDIT copy and the LD_PRELOAD copy of one process share its slot; pid 1 of two
     * containers started in the same clock tick are two processes (their namespaces differ) */
    for (int i = 0; i < SD_MAX_SLOTS; i++) {
        struct sd_slot *s = slot_at(h, i);
        if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) == SD_SLOT_LIVE &&
            same_process(s->pid, s->start_time, s->pid_ns_dev, s->pid_ns_ino, pid, start, self_ns_dev, self_ns_ino))
            return i;
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        int first = (int)((unsigned)pid % SD_MAX_SLOTS);
        for (int k = 0; k < SD_MAX_SLOTS; k++) {
            int i = (first + k) % SD_MAX_SLOTS;
            struct sd_slot *s = slot_at(h, i);
            uint32_t expected = SD_SLOT_FREE;
            if (__atomic_compare_exchange_n(&s->state, &expected, SD_SLOT_CLAIMING, 0,
                                            __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
                s->pid = pid;
                s->start_time = start;
                s->pid_ns_dev = self_ns_dev;
                s->pid_ns_ino = self_ns_ino;
                s->ppid = (int)getppid();
                s->group = -1;
                s->nvisible = -1;
                s->started_ns = sd_now_ns(CLOCK_REALTIME);
                read_exe(s->exe, sizeof s->exe);
                return i;
            }
        }
        /* full: reclaim the slots of dead processes (rare; under the lock) */
        lock_header(h);
        for (int i = 0; i < SD_MAX_SLOTS; i++)
            if (seedance_registry_slot_dead(h, i) == 1)
                reclaim_locked(h, i);
        unlock_header(h);
    }
    return -1;
}

static int parse_limits(const char *spec, uint64_t *limits)
{
    /* "8G" (every device) or "8G,1:4G" or "0:2G,1:4G": physical device ordinals */
    char buf[512];
    snprintf(buf, sizeof buf, "%s", spec);
    int any = 0;
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(item, ':');
        int ok;
        if (colon) {
            *colon = '\0';
            char *end;
            long dev = strtol(item, &end, 10);
            uint64_t v = sd_parse_size(colon + 1, &ok);
            if (*end || dev < 0 || dev >= SD_MAX_DEVICES || !ok)
                return -1;
            limits[dev] = v;
        } else {
            uint64_t v = sd_parse_size(item, &ok);
            if (!ok)
                return -1;
            for (int d = 0; d < SD_MAX_DEVICES; d++)
                limits[d] = v;
        }
        any = 1;
    }
    return any ? 0 : -1;
}

/* An overflow entry of this process in group g (shared by its LD_AUDIT and LD_PRELOAD
 * copies, like a slot); -1 when every entry is taken.  *joined: it was there already. */
static int overflow_claim(struct sd_group *g, int pid, uint64_t start, int *joined)
{
    *joined = 0;
    for (int i = 0; i < SD_MAX_OVERFLOW; i++)
        if (same_process(__atomic_load_n(&g->overflow[i].pid, __ATOMIC_ACQUIRE), g->overflow[i].start_time,
                         g->overflow[i].pid_ns_dev, g->overflow[i].pid_ns_ino, pid, start, self_ns_dev, self_ns_ino)) {
            *joined = 1;
            return i;
        }
    for (int i = 0; i < SD_MAX_OVERFLOW; i++) {
        int32_t expected = 0;
        if (__atomic_compare_exchange_n(&g->overflow[i].pid, &expected, pid, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED)) {
            g->overflow[i].start_time = start;
            g->overflow[i].pid_ns_dev = self_ns_dev;
            g->overflow[i].pid_ns_ino = self_ns_ino;
            return i;
        }
    }
    return -1;
}

/* Overflow members whose process is gone (SIGKILL: no destructor ran) stop counting as
 * members.  What they had reserved stays reserved: their records lived only in their
 * own memory, so the bytes are unknown; the quota errs on the side of refusing, and the
 * group goes with its run.  Under the lock. */
static void overflow_sweep_locked(struct sd_group *g)
{
    for (int i = 0; i < SD_MAX_OVERFLOW; i++) {
        int32_t pid = __atomic_load_n(&g->overflow[i].pid, __ATOMIC_ACQUIRE);
        if (pid && !pid_alive(pid, g->overflow[i].start_time, g->overflow[i].pid_ns_dev, g->overflow[i].pid_ns_ino) &&
            __atomic_compare_exchange_n(&g->overflow[i].pid, &pid, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED) &&
            __atomic_load_n(&g->members, __ATOMIC_ACQUIRE))
            __atomic_fetch_sub(&g->members, 1, __ATOMIC_ACQ_REL);
    }
}

/* The group table is full: give back the groups of runs whose owner is gone (their
 * `seedance run` was killed, or plain LD_PRELOAD processes with SEEDANCE_MEM_LIMIT made a
 * group each): reclaim their members' slots that are dead or exited, then free the
 * groups left without members.  A live owner's group is never touched: it still has
 * a report to read.  Under the lock. */
static void gc_groups_locked(void *base)
{
    for (int i = 0; i < SD_MAX_GROUPS; i++) {
        struct sd_group *g = group_at(base, i);
        if (!__atomic_load_n(&g->key, __ATOMIC_ACQUIRE) || pid_alive(g->owner_pid, g->owner_start, g->owner_ns_dev, g->owner_ns_ino))
            continue;
        overflow_sweep_locked(g);
        for (int w = 0; w < SD_MAX_SLOTS / 64; w++) {
            uint64_t bits = __atomic_load_n(&g->slot_bits[w], __ATOMIC_ACQUIRE);
            while (bits) {
                int slot = w * 64 + __builtin_ctzll(bits);
                bits &= bits - 1;
                if (seedance_registry_slot_dead(base, slot) == 1)
                    reclaim_locked(base, slot);
            }
        }
        if (__atomic_load_n(&g->key, __ATOMIC_ACQUIRE) && !__atomic_load_n(&g->members, __ATOMIC_ACQUIRE))
            __atomic_store_n(&g->key, 0, __ATOMIC_RELEASE);
    }
}

static int sd_overflow_index = -1;   /* this process's entry in sd_group->overflow[], -1 none */

/* Join (or create) the quota group of this run.  `slotted`: this process has a registry
 * slot; without one (registry full) it still shares the group's quota through an
 * overflow entry: every process of the run is held to the same quota, never to a
 * private one of its own (with one each, N processes of a run could together allocate
 * N times --mem-limit). */
static void attach_group(void *base, int pid, uint64_t start, int slotted)
{
    uint64_t limits[SD_MAX_DEVICES] = {0};
    int have_limits = sd_cfg.mem_limit[0] != '\0';
    if (have_limits && parse_limits(sd_cfg.mem_limit, limits) != 0) {
        sd_note("SEEDANCE_MEM_LIMIT=%s is not understood: no quota", sd_cfg.mem_limit);
        have_limits = 0;
    }
    uint64_t key = sd_cfg.group_key;
    if (!key && !have_limits)
        return;
    if (!key)
        key = ((uint64_t)pid << 32) ^ start ^ self_ns_ino ^ 0x5eedull;
    if (!base) { /* no registry at all: the quota still holds for this process */
        memcpy(sd_local_group.limit, limits, sizeof limits);
        sd_local_group.key = key;
        sd_group = &sd_local_group;
        return;
    }
    int g = group_find(base, key);
    if (g < 0) {
        lock_header(base);
#ifdef SEEDANCE_TEST_HOOKS
        if (sd_cfg.hold_lock_ms > 0) /* tests: die holding the lock (tests/shim) */
            usleep((useconds_t)sd_cfg.hold_lock_ms * 1000);
#endif
        g = group_open_locked(base, key, limits, SD_MAX_DEVICES, sd_cfg.owner_pid ? sd_cfg.owner_pid : pid);
        if (g == -ENOSPC) {
            gc_groups_locked(base);
            g = group_open_locked(base, key, limits, SD_MAX_DEVICES, sd_cfg.owner_pid ? sd_cfg.owner_pid : pid);
        }
        unlock_header(base);
    }
    if (g < 0 && !sd_cfg.group_key) {
        /* no SEEDANCE_GROUP: the quota is this process's own anyway (plain LD_PRELOAD with
         * SEEDANCE_MEM_LIMIT), so keeping it in process memory changes nothing but who
         * can see it */
        sd_note("quota group table full: this process's own quota is kept in its memory");
        memcpy(sd_local_group.limit, limits, sizeof limits);
        sd_local_group.key = key;
        sd_group = &sd_local_group;
        return;
    }
    if (g < 0) {
        /* 64 runs at once: refuse what a shared quota covers rather than grant a private one */
        sd_warn("quota group table full (%d groups): allocations under SEEDANCE_MEM_LIMIT are refused",
                SD_MAX_GROUPS);
        memcpy(sd_local_group.limit, limits, sizeof limits);
        memcpy(sd_local_group.used, limits, sizeof limits);
        sd_group = &sd_local_group;
        return;
    }
    struct sd_group *group = group_at(base, g);
    if (!slotted) {
        int joined;
        int entry = overflow_claim(group, pid, start, &joined);
        if (entry < 0) {
            /* not even an overflow entry: a member nobody could account for; refuse
             * every allocation a limit covers (a quota'd device shows as full) */
            __atomic_fetch_add(&group->overflow_refused, 1, __ATOMIC_ACQ_REL);
            sd_warn("registry full (%d slots, %d overflow entries): allocations under SEEDANCE_MEM_LIMIT "
                    "are refused", SD_MAX_SLOTS, SD_MAX_OVERFLOW);
            memcpy(sd_local_group.limit, group->limit, sizeof sd_local_group.limit);
            memcpy(sd_local_group.used, group->limit, sizeof sd_local_group.used);
            sd_group = &sd_local_group;
            return;
        }
        sd_overflow_index = entry;
        if (!joined) {
            __atomic_fetch_add(&group->overflow_total, 1, __ATOMIC_ACQ_REL);
            __atomic_fetch_add(&group->members, 1, __ATOMIC_ACQ_REL);
            sd_warn("registry full (%d live instances): this process shares its run's quota without a "
                    "slot; its allocations are not itemised", SD_MAX_SLOTS);
        }
        sd_group = group;
        return;
    }
    sd_group = group;
    __atomic_fetch_add(&sd_group->members, 1, __ATOMIC_ACQ_REL);
    if (sd_slot && sd_slot != &sd_local_slot) {
        int index = (int)(((char *)sd_slot - ((char *)base + SD_HEADER_BYTES + SD_GROUPS_BYTES)) / SD_SLOT_BYTES);
        sd_slot->group = g;
        __atomic_fetch_or(&group->slot_bits[index / 64], 1ull << (index % 64), __ATOMIC_ACQ_REL);
    }
}

int sd_registry_attach(void)
{
    int pid = (int)getpid();
    uint64_t start = self_start_time();
    seedance_pid_ns(&self_ns_dev, &self_ns_ino);
    if (!sd_registry)
        sd_registry = map_registry();
    int index = -1;
    if (sd_registry)
        index = claim_slot(sd_registry, pid, start);
    if (index >= 0) {
        /* one slot per process: the LD_AUDIT copy and the LD_PRELOAD copy share it, and
         * whichever claims it attaches it to the quota group (a member per slot) */
        struct sd_slot *s = slot_at(sd_registry, index);
        int joined = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) == SD_SLOT_LIVE;
        sd_slot = s;
        if (sd_is_audit)
            __atomic_fetch_or(&s->flags, 1u, __ATOMIC_RELAXED);
        if (sd_events_on)
            __atomic_fetch_or(&s->flags, 2u, __ATOMIC_RELAXED);
        if (joined) {
            if (s->group >= 0 && s->group < SD_MAX_GROUPS)
                sd_group = group_at(sd_registry, s->group);
            return 0;
        }
        attach_group(sd_registry, pid, start, 1);
        __atomic_store_n(&s->state, SD_SLOT_LIVE, __ATOMIC_RELEASE);
        return 0;
    }
    memset(&sd_local_slot, 0, sizeof sd_local_slot);
    sd_local_slot.pid = pid;
    sd_local_slot.start_time = start;
    sd_local_slot.pid_ns_dev = self_ns_dev;
    sd_local_slot.pid_ns_ino = self_ns_ino;
    sd_local_slot.nvisible = -1;
    sd_local_slot.group = -1;
    sd_local_slot.state = SD_SLOT_LIVE;
    sd_slot = &sd_local_slot;
    attach_group(sd_registry, pid, start, 0);
    if (sd_registry && !sd_group)
        sd_warn("registry full (%d live instances): this process is not accounted", SD_MAX_SLOTS);
    return -1;
}

void sd_registry_detach_at_exit(void)
{
    struct sd_slot *s = sd_slot;
    if (!s)
        return;
    if (s == &sd_local_slot) {
        /* an overflow member: give back what it still holds (its own records), and its
         * entry; the copy that clears the entry drops the membership */
        struct sd_group *g = sd_group;
        if (!g || g == &sd_local_group || sd_overflow_index < 0 || s->pid != (int)getpid())
            return;
        uint64_t held[SD_MAX_DEVICES];
        sum_records(s, held);
        for (int d = 0; d < SD_MAX_DEVICES; d++)
            if (held[d])
                __atomic_fetch_sub(&g->used[d], held[d], __ATOMIC_ACQ_REL);
        int32_t pid = s->pid;
        if (__atomic_compare_exchange_n(&g->overflow[sd_overflow_index].pid, &pid, 0, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            __atomic_fetch_sub(&g->members, 1, __ATOMIC_ACQ_REL);
        return;
    }
    /* both copies (audit, preload) get here; the first one to mark the slot does it */
    uint32_t expected = SD_SLOT_LIVE;
    if (s->pid != (int)getpid() || !__atomic_compare_exchange_n(&s->state, &expected, SD_SLOT_CLAIMING, 0,
                                                                 __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return;
    sd_event(SD_EV_EXIT, -1, -1, 0, 0, 0, 0, "exit");
    uint64_t held[SD_MAX_DEVICES];
    sum_records(s, held);
    memcpy(s->cur, held, sizeof held);
    if (sd_group && sd_group != &sd_local_group) {
        /* the driver frees what is left when the process goes: give it back to the quota */
        for (int d = 0; d < SD_MAX_DEVICES; d++)
            if (held[d])
                __atomic_fetch_sub(&sd_group->used[d], held[d], __ATOMIC_ACQ_REL);
        __atomic_fetch_sub(&sd_group->members, 1, __ATOMIC_ACQ_REL);
    }
    s->exited_ns = sd_now_ns(CLOCK_REALTIME);
    __atomic_store_n(&s->state, SD_SLOT_EXITED, __ATOMIC_RELEASE);
}

/* ---- events ------------------------------------------------------------------ */

static void copy_text(char *dst, const char *src)
{
    size_t i = 0;
    if (src)
        for (; src[i] && i < SD_EVENT_TEXT - 1; i++)
            dst[i] = src[i];
    dst[i] = '\0';
}

static struct sd_event *event_begin(void)
{
    struct sd_slot *s = sd_slot;
    if (!s)
        return NULL;
    uint64_t h = __atomic_fetch_add(&s->ring_head, 1, __ATOMIC_RELAXED);
    struct sd_event *e = &s->ring[h % SD_RING_EVENTS];
    __atomic_store_n(&e->seq, 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    e->time_ns = h + 1; /* stash the sequence until published */
    return e;
}

static void event_publish(struct sd_event *e)
{
    uint64_t seq = e->time_ns;
    e->time_ns = sd_now_ns(CLOCK_MONOTONIC);
    __atomic_store_n(&e->seq, seq, __ATOMIC_RELEASE);
}

/* Notes are events of the ring (and lines on stderr): the registry reports its own troubles
 * with them too. */
/* One line on stderr, whatever SEEDANCE_VERBOSE says (the application's stdout is never
 * touched): for what silently changes what the process gets (disable, full registry). */
void sd_say(const char *text)
{
    char line[SD_EVENT_TEXT + 48];
    int len = snprintf(line, sizeof line, "seedance-shim[%d]: %s\n", (int)getpid(), text);
    if (len > 0 && write(2, line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1) < 0) {
        /* nothing useful to do when stderr is closed */
    }
}

/* A note in the event stream, and on stderr when SAY: a warning always, a note with
 * SEEDANCE_VERBOSE only. */
static void note(int say, const char *fmt, va_list ap)
{
    char buf[SD_EVENT_TEXT];
    if (vsnprintf(buf, sizeof buf, fmt, ap) < 0)
        return;
    sd_event(SD_EV_NOTE, -1, -1, 0, 0, 0, 0, buf);
    if (say)
        sd_say(buf);
}

void sd_note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    note(sd_cfg.verbose, fmt, ap);
    va_end(ap);
}

void sd_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    note(1, fmt, ap);
    va_end(ap);
}

void sd_event(uint32_t kind, int api, int device, int result, uint64_t ptr, uint64_t bytes,
              uint32_t lib, const char *text)
{
    struct sd_event *e = event_begin();
    if (!e)
        return;
    e->kind = kind;
    e->api = (uint32_t)api;
    e->device = device;
    e->result = result;
    e->ptr = ptr;
    e->bytes = bytes;
    e->lib = lib;
    e->obj = e->obj2 = e->flag = 0;
    copy_text(e->text, text);
    event_publish(e);
}

void sd_audit_event(uint32_t kind, uint32_t obj, uint32_t obj2, uint32_t flag, const char *text)
{
    struct sd_event *e = event_begin();
    if (!e)
        return;
    e->kind = kind;
    e->api = 0;
    e->device = -1;
    e->result = 0;
    e->ptr = e->bytes = 0;
    e->lib = 0;
    e->obj = obj;
    e->obj2 = obj2;
    e->flag = flag;
    copy_text(e->text, text);
    event_publish(e);
}

/* ---- calling library --------------------------------------------------------- */

/* return address -> library index: the cache (its hit path is inline in registry.h) */
uint64_t sd_lib_cache[256];

/* a followed child gets a slot of its own, with its own library table */
void sd_registry_after_fork(void)
{
    memset(sd_lib_cache, 0, sizeof sd_lib_cache);
}

uint32_t sd_lib_index_slow(void *caller, unsigned bucket, uint64_t addr)
{
    struct sd_slot *s = sd_slot;
    if (!s)
        return SD_LIB_UNKNOWN;
    Dl_info info;
    char exe[SD_LIB_PATH_LEN];
    const char *name = "?";
    if (dladdr(caller, &info) && info.dli_fname && info.dli_fname[0]) {
        name = info.dli_fname;
        if (!strchr(name, '/') || strcmp(name, program_invocation_name) == 0) {
            /* the main program shows up as argv[0] */
            read_exe(exe, sizeof exe);
            name = exe;
        }
    }
    uint32_t n = __atomic_load_n(&s->nlibs, __ATOMIC_ACQUIRE);
    uint32_t index = SD_LIB_UNKNOWN; /* table full: attributed to no library */
    int found = 0;
    for (uint32_t i = 0; i < n && i < SD_MAX_LIBS; i++)
        if (__atomic_load_n(&s->libs[i].ready, __ATOMIC_ACQUIRE) &&
            strncmp(s->libs[i].path, name, SD_LIB_PATH_LEN - 1) == 0) {
            index = i;
            found = 1;
            break;
        }
    if (!found) {
        uint32_t i = __atomic_fetch_add(&s->nlibs, 1, __ATOMIC_ACQ_REL);
        if (i < SD_MAX_LIBS) {
            snprintf(s->libs[i].path, SD_LIB_PATH_LEN, "%s", name);
            __atomic_store_n(&s->libs[i].ready, 1, __ATOMIC_RELEASE);
            index = i;
        }
    }
    __atomic_store_n(&sd_lib_cache[bucket], (addr << 16) | index, __ATOMIC_RELAXED);
    return index;
}

/* ---- allocation records ------------------------------------------------------ */

#define SD_MAX_PROBE 64

static inline uint32_t record_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (uint32_t)k & (SD_MAX_RECORDS - 1);
}

int sd_record_insert(uint64_t key, uint64_t size, int device, int api, uint32_t lib)
{
    struct sd_slot *s = sd_slot;
    if (!s)
        return 0;
    uint32_t i = record_hash(key);
    for (int probe = 0; probe < SD_MAX_PROBE; probe++, i = (i + 1) & (SD_MAX_RECORDS - 1)) {
        struct sd_record *r = &s->records[i];
        uint64_t cur = __atomic_load_n(&r->ptr, __ATOMIC_RELAXED);
        while (cur == 0 || cur == SD_RECORD_TOMBSTONE) {
            if (__atomic_compare_exchange_n(&r->ptr, &cur, key, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
                r->size = size;
                r->device = device;
                r->api = (uint16_t)api;
                r->lib = (uint16_t)lib;
                return 1;
            }
        }
    }
    __atomic_fetch_add(&s->untracked, 1, __ATOMIC_RELAXED);
    return 0;
}

int sd_record_find(uint64_t key)
{
    struct sd_slot *s = sd_slot;
    if (!s)
        return -1;
    uint32_t i = record_hash(key);
    for (int probe = 0; probe < SD_MAX_PROBE; probe++, i = (i + 1) & (SD_MAX_RECORDS - 1)) {
        uint64_t cur = __atomic_load_n(&s->records[i].ptr, __ATOMIC_ACQUIRE);
        if (cur == key)
            return (int)i;
        if (cur == 0)
            return -1;
    }
    return -1;
}

int sd_record_take(uint64_t key, uint64_t *size, int *device)
{
    int i = sd_record_find(key);
    if (i < 0)
        return 0;
    struct sd_record *r = &sd_slot->records[i];
    *size = r->size;
    *device = r->device;
    /* The driver has just freed this pointer for us, so no other thread can hold the
     * same record now: a release store retires it (one locked instruction fewer than a
     * CAS on the hot path). */
    __atomic_store_n(&r->ptr, (uint64_t)SD_RECORD_TOMBSTONE, __ATOMIC_RELEASE);
    return 1;
}
