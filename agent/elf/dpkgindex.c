/* dpkgindex.c: the dpkg file lists (/var/lib/dpkg/info/NAME.list) read and indexed by file
 * name on a thread of their own, for collect/practice.py's _dpkg_by_name.
 *
 * Why: which Debian package ships a file is a search of every list (hundreds of files,
 * several MB), and in Python both the reads and each name's search over all of them came
 * in the middle of a check's report.  Started when a check's root loop starts, the thread reads
 * and indexes the lists on a core the loop does not use; a lookup is then a hash probe.
 *
 * What it keeps of _dpkg_by_name: the lists in the order Python's sorted() puts their
 * names (byte order: package names are ASCII; a name that is not makes the whole index
 * refuse, and Python reads the lists itself); a list that cannot be opened or read is
 * skipped; a match is a line ended by a newline whose text after its last '/' is the name
 * (what finding "/NAME\n" in the bytes finds, for a name without '/' or newline), in list
 * order, then in line order.  Each list's stat, taken before it is read, is kept for the
 * check cache's recorder.
 */
#define _GNU_SOURCE /* memrchr */
#include "fastelf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct dp_entry {
    int32_t list, next;
    uint32_t hash, base_len;
    size_t line_at, line_len; /* into the list's data */
};

struct sd_dpkg {
    char *dir;
    pthread_t thread;
    int started, joined, status;
    size_t n_lists;
    char **names;   /* file names (pkg.list, pkg:arch.list) */
    char **data;    /* each list's bytes (NULL: it could not be read) */
    struct sd_dpkg_input *inputs; /* per list, and one more for the directory */
    struct dp_entry *entries;
    size_t n_entries, cap_entries;
    int32_t *heads, *tails;
    size_t n_buckets;
};

static uint32_t hash_bytes(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void fill_input(struct sd_dpkg_input *in, const struct stat *st, int err)
{
    memset(in, 0, sizeof *in);
    in->err = err;
    if (!err) {
        in->dev = (unsigned long long)st->st_dev;
        in->ino = (unsigned long long)st->st_ino;
        in->mode = (unsigned long long)st->st_mode;
        in->size = (long long)st->st_size;
        in->mtime_ns = (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
        in->ctime_ns = (long long)st->st_ctim.tv_sec * 1000000000LL + st->st_ctim.tv_nsec;
    }
}

/* a whole file as _read_bytes reads it (O_NONBLOCK: a FIFO reads as what it holds now);
 * ``size_hint``: its size from the stat the recorder took just before (0: unknown), only
 * the first buffer's size: the file is read to its end whatever it holds now */
static int read_all(const char *path, long long size_hint, char **out, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -1;
    size_t cap = size_hint > 0 ? (size_t)size_hint + 1 : 4096;
    char *buf = malloc(cap);
    size_t n = 0;
    if (!buf) {
        close(fd);
        return -1;
    }
    for (;;) {
        if (n == cap) {
            char *bigger = realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
                close(fd);
                return -1;
            }
            buf = bigger;
            cap *= 2;
        }
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            free(buf);
            close(fd);
            return -1;
        }
        if (got == 0)
            break;
        n += (size_t)got;
    }
    close(fd);
    *out = buf;
    *len = n;
    return 0;
}

static int add_entry(struct sd_dpkg *d, int32_t list, size_t line_at, size_t line_len, size_t base_len,
                     uint32_t hash)
{
    if (d->n_entries == d->cap_entries) {
        size_t cap = d->cap_entries ? d->cap_entries * 2 : 65536;
        struct dp_entry *bigger = realloc(d->entries, cap * sizeof *bigger);
        if (!bigger)
            return -1;
        d->entries = bigger;
        d->cap_entries = cap;
    }
    struct dp_entry *e = &d->entries[d->n_entries];
    e->list = list;
    e->next = -1;
    e->hash = hash;
    e->base_len = (uint32_t)base_len;
    e->line_at = line_at;
    e->line_len = line_len;
    size_t b = hash & (d->n_buckets - 1);
    int32_t id = (int32_t)d->n_entries++;
    if (d->tails[b] < 0)
        d->heads[b] = id;
    else
        d->entries[d->tails[b]].next = id;
    d->tails[b] = id;
    return 0;
}

static int build(struct sd_dpkg *d)
{
    struct stat st;
    d->inputs = calloc(1, sizeof *d->inputs); /* the directory first */
    if (!d->inputs)
        return -1;
    fill_input(&d->inputs[0], &st, stat(d->dir, &st) == 0 ? 0 : (errno ? errno : -1));
    DIR *dir = opendir(d->dir);
    if (!dir)
        return -1;
    size_t cap = 0;
    struct dirent *ent;
    while ((ent = readdir(dir)) != NULL) {
        const char *name = ent->d_name;
        size_t len = strlen(name);
        if (len < 5 || strcmp(name + len - 5, ".list"))
            continue;
        for (size_t i = 0; i < len; i++)
            if ((unsigned char)name[i] >= 0x80) {
                closedir(dir);
                return -1; /* not ASCII: byte order may not be Python's order */
            }
        if (d->n_lists == cap) {
            cap = cap ? cap * 2 : 1024;
            char **bigger = realloc(d->names, cap * sizeof *bigger);
            if (!bigger) {
                closedir(dir);
                return -1;
            }
            d->names = bigger;
        }
        d->names[d->n_lists] = strdup(name);
        if (!d->names[d->n_lists]) {
            closedir(dir);
            return -1;
        }
        d->n_lists++;
    }
    closedir(dir);
    if (d->n_lists)
        qsort(d->names, d->n_lists, sizeof *d->names, by_name);
    d->data = calloc(d->n_lists + 1, sizeof *d->data);
    struct sd_dpkg_input *inputs = realloc(d->inputs, (d->n_lists + 1) * sizeof *inputs);
    if (!d->data || !inputs)
        return -1;
    d->inputs = inputs;
    d->n_buckets = 1 << 17;
    d->heads = malloc(d->n_buckets * sizeof *d->heads);
    d->tails = malloc(d->n_buckets * sizeof *d->tails);
    if (!d->heads || !d->tails)
        return -1;
    memset(d->heads, 0xff, d->n_buckets * sizeof *d->heads);
    memset(d->tails, 0xff, d->n_buckets * sizeof *d->tails);
    size_t dir_len = strlen(d->dir);
    char *path = malloc(dir_len + 2 + 4096);
    if (!path)
        return -1;
    for (size_t i = 0; i < d->n_lists; i++) {
        size_t name_len = strlen(d->names[i]);
        if (name_len >= 4096)
            continue;
        memcpy(path, d->dir, dir_len);
        path[dir_len] = '/';
        memcpy(path + dir_len + 1, d->names[i], name_len + 1);
        /* the recorder's stat, before the read (as the audit hook stats an opened path) */
        fill_input(&d->inputs[i + 1], &st, stat(path, &st) == 0 ? 0 : (errno ? errno : -1));
        char *buf;
        size_t len;
        if (read_all(path, d->inputs[i + 1].err ? 0 : d->inputs[i + 1].size, &buf, &len))
            continue; /* (as _dpkg_lists: a list that cannot be read is left out) */
        d->data[i] = buf;
        size_t at = 0;
        while (at < len) {
            char *nl = memchr(buf + at, '\n', len - at);
            if (!nl)
                break; /* a last line without a newline is never matched */
            size_t end = (size_t)(nl - buf);
            char *slash = end > at ? memrchr(buf + at, '/', end - at) : NULL;
            if (slash) {
                size_t base_at = (size_t)(slash - buf) + 1;
                if (add_entry(d, (int32_t)i, at, end - at, end - base_at, hash_bytes(buf + base_at, end - base_at))) {
                    free(path);
                    return -1;
                }
            }
            at = end + 1;
        }
    }
    free(path);
    return 0;
}

static void *run(void *arg)
{
    struct sd_dpkg *d = arg;
    d->status = build(d) ? SD_DPKG_FALLBACK : SD_DPKG_OK;
    return NULL;
}

/* Start reading and indexing the lists of ``dir`` on a thread; NULL without memory. */
struct sd_dpkg *sd_dpkg_start(const char *dir)
{
    struct sd_dpkg *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->dir = strdup(dir);
    d->status = SD_DPKG_FALLBACK;
    if (!d->dir) {
        free(d);
        return NULL;
    }
    if (pthread_create(&d->thread, NULL, run, d) == 0)
        d->started = 1;
    else
        run(d); /* no thread: read them here */
    return d;
}

/* Wait for the index: SD_DPKG_OK, or SD_DPKG_FALLBACK (Python reads the lists itself). */
int sd_dpkg_wait(struct sd_dpkg *d)
{
    if (d->started && !d->joined) {
        pthread_join(d->thread, NULL);
        d->joined = 1;
    }
    return d->status;
}

int sd_dpkg_count(struct sd_dpkg *d)
{
    return (int)d->n_lists;
}

const char *sd_dpkg_name(struct sd_dpkg *d, int i)
{
    return d->names[i];
}

/* index 0: the directory; i + 1: list i */
struct sd_dpkg_input *sd_dpkg_input(struct sd_dpkg *d, int i)
{
    return &d->inputs[i];
}

/* The lines whose text after the last '/' is name[0..len): up to ``cap`` of them as
 * (list, pointer, length); returns how many there are (more than cap: ask again). */
long sd_dpkg_find(struct sd_dpkg *d, const char *name, size_t len, int *lists, const char **lines, size_t *lens,
                  long cap)
{
    uint32_t h = hash_bytes(name, len);
    long count = 0;
    for (int32_t e = d->heads[h & (d->n_buckets - 1)]; e >= 0; e = d->entries[e].next) {
        const struct dp_entry *ent = &d->entries[e];
        if (ent->hash != h || ent->base_len != len)
            continue;
        const char *line = d->data[ent->list] + ent->line_at;
        if (memcmp(line + ent->line_len - len, name, len))
            continue;
        if (count < cap) {
            lists[count] = ent->list;
            lines[count] = line;
            lens[count] = ent->line_len;
        }
        count++;
    }
    return count;
}

void sd_dpkg_free(struct sd_dpkg *d)
{
    if (!d)
        return;
    sd_dpkg_wait(d);
    for (size_t i = 0; i < d->n_lists; i++) {
        free(d->names[i]);
        if (d->data)
            free(d->data[i]);
    }
    free(d->names);
    free(d->data);
    free(d->inputs);
    free(d->entries);
    free(d->heads);
    free(d->tails);
    free(d->dir);
    free(d);
}
