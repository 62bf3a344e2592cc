/* sd_walk: the ELF files under a directory, found as collect/scan.py's walk finds them.
 *
 * A check's walk is system calls: a listing per directory, an open and a 4-byte read per
 * file that may be ELF, a stat per link.  In Python each also builds objects (DirEntry,
 * str, stat_result), which on a big tree (/usr/lib/x86_64-linux-gnu, site-packages with
 * torch) is a large share of a check.  Here the same walk runs with no
 * object per entry and, with threads > 1, on several threads at once (the calls release
 * nothing in Python: cffi drops the GIL for the whole walk).
 *
 * What it must keep is scan.py's walk exactly (Scanner._walk_list, _walk_files; the tests
 * compare both on trees built to hit every case):
 *   - os.walk's order: top-down, each directory's files before its subdirectories, names
 *     sorted as Python sorts str: by code point, the bytes decoded as UTF-8 with invalid
 *     bytes as lone surrogates (surrogateescape), which is not byte order (cp_compare);
 *   - a symbolic link to a directory is neither entered nor counted; a link to anything
 *     else is stat'ed (a loop: unreadable, "symbolic link loop"; dangling: skipped);
 *   - names ending with a never-ELF suffix are counted and skipped unopened; regular files
 *     under 16 bytes, FIFOs, devices and sockets are skipped; the rest are opened
 *     (O_NONBLOCK: a FIFO behind a link must not block) and their first 4 bytes read;
 *   - a name with a config suffix is handed back whatever it holds (kind 'C'): whether it
 *     is a seedance config is Python's question (_is_seedance_config).
 * With ``record``, every directory listed and every file opened or stat'ed is handed back
 * with what stat said (the check cache's inputs, collect/inputs.py), as the Python walk's
 * os.stat, os.scandir and os.open are recorded.
 *
 * The output is one buffer of records (struct sd_walk_record, then path_len bytes of path)
 * in walk order; the counts are the walk's files, skipped and unreadable, without the 'C'
 * records' (counted by the caller once it knows which are configs). */
#define _GNU_SOURCE
#include <dirent.h> /* (DT_* only: the entries are read with getdents64) */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fastelf.h"

struct buf {
    unsigned char *data;
    size_t len, cap;
    int failed; /* out of memory: the walk reports SD_WALK_NOMEM */
};

static void buf_put(struct buf *b, const void *src, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 16384;
        while (cap < b->len + n)
            cap *= 2;
        unsigned char *data = realloc(b->data, cap);
        if (!data) {
            b->failed = 1;
            return;
        }
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, n);
    b->len += n;
}

/* ---- names in Python's order --------------------------------------------------------- */

/* The next code point of ``s`` (length n) at *at, as Python's UTF-8 decoder with
 * surrogateescape gives it: a well-formed sequence (no overlong form, no encoded
 * surrogate, nothing above U+10FFFF) is its code point; any other byte is U+DC00 + byte
 * (only bytes >= 0x80 fail, and those map to U+DC80..U+DCFF). */
static uint32_t next_cp(const unsigned char *s, size_t n, size_t *at)
{
    size_t i = *at;
    unsigned c = s[i];
    if (c < 0x80) {
        *at = i + 1;
        return c;
    }
    size_t len = 0;
    uint32_t cp = 0;
    /* the second byte's range: the lead bytes and these ranges leave out overlong forms,
     * encoded surrogates and anything above U+10FFFF */
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        cp = c & 0x0F;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F; /* no encoded surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        cp = c & 0x07;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    }
    if (len && i + len <= n) {
        int ok = s[i + 1] >= lo && s[i + 1] <= hi;
        for (size_t k = 2; ok && k < len; k++)
            ok = (s[i + k] & 0xC0) == 0x80;
        if (ok) {
            for (size_t k = 1; k < len; k++)
                cp = (cp << 6) | (s[i + k] & 0x3F);
            *at = i + len;
            return cp;
        }
    }
    *at = i + 1;
    return 0xDC00 + c;
}

static int cp_compare(const char *a, const char *b)
{
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    size_t i = 0;
    while (x[i] && x[i] == y[i])
        i++;
    if (x[i] < 0x80 && y[i] < 0x80 && (i == 0 || x[i - 1] < 0x80))
        return (int)x[i] - (int)y[i]; /* ASCII where they differ, at a sequence boundary */
    /* decode from the last boundary before the difference: the position after an ASCII
     * byte (never part of a longer sequence) or the start; the prefix decodes alike */
    while (i > 0 && x[i - 1] >= 0x80)
        i--;
    size_t nx = i + strlen(a + i), ny = i + strlen(b + i), ax = i, ay = i;
    while (ax < nx && ay < ny) {
        uint32_t cx = next_cp(x, nx, &ax), cy = next_cp(y, ny, &ay);
        if (cx != cy)
            return cx < cy ? -1 : 1;
    }
    return (ax < nx) - (ay < ny);
}

/* ---- one directory --------------------------------------------------------------------- */

struct linux_dirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

struct entry {
    char *name;
    unsigned char type; /* DT_* from the listing (DT_UNKNOWN resolved by an lstat) */
};

static int entry_compare(const void *a, const void *b)
{
    return cp_compare(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

struct walk; /* the shared settings */

struct task {
    int kind;           /* 0: done (listing output only), 1: files, 2: subtree */
    char *path;         /* the directory (files) or the subtree's root */
    struct entry *files; /* kind 1: the files to look at (owned by the listing) */
    size_t n_files;
    struct buf out;
    long long files_n, skipped, unreadable;
    /* (dev, inode) of link targets sniffed in this task -> 1 elf, 2 other (seen_put) */
    unsigned long long *seen_keys;
    unsigned char *seen_kinds;
    size_t seen_cap, seen_len;
};

struct walk {
    int record;
    const char *never; /* NUL-separated suffixes, an empty one last */
    const char *config;
    struct task *tasks;
    size_t n_tasks, cap_tasks;
    size_t next; /* the next task to take (atomic) */
    int nomem;
    /* the listings of the top two levels, freed at the end */
    struct entry **listings;
    size_t *listing_sizes;
    size_t n_listings, cap_listings;
};

static void put_record(struct buf *out, int kind, const char *path, int err, const struct stat *st, int plain,
                       int elf)
{
    struct sd_walk_record rec;
    memset(&rec, 0, sizeof rec);
    size_t len = strlen(path);
    rec.path_len = (unsigned int)len;
    rec.kind = (unsigned char)kind;
    rec.plain = (unsigned char)plain;
    rec.elf = (unsigned char)elf;
    rec.err = err;
    if (st) {
        rec.has_stat = 1;
        rec.dev = (unsigned long long)st->st_dev;
        rec.ino = (unsigned long long)st->st_ino;
        rec.mode = (unsigned long long)st->st_mode;
        rec.nlink = (unsigned long long)st->st_nlink;
        rec.uid = (unsigned long long)st->st_uid;
        rec.gid = (unsigned long long)st->st_gid;
        rec.rdev = (unsigned long long)st->st_rdev;
        rec.size = (long long)st->st_size;
        rec.blksize = (long long)st->st_blksize;
        rec.blocks = (long long)st->st_blocks;
        rec.atime_ns = (long long)st->st_atim.tv_sec * 1000000000LL + st->st_atim.tv_nsec;
        rec.mtime_ns = (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
        rec.ctime_ns = (long long)st->st_ctim.tv_sec * 1000000000LL + st->st_ctim.tv_nsec;
    }
    buf_put(out, &rec, sizeof rec);
    buf_put(out, path, len);
}

/* An 'S' record of what stat says of ``path`` now: a path that could not be opened, as the
 * recorder's stat before an open would note it (collect/inputs.py, _stat_now) */
static void record_stat(struct task *t, const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0)
        put_record(&t->out, 'S', path, 0, &st, 0, 0);
    else
        put_record(&t->out, 'S', path, errno ? errno : -1, NULL, 0, 0);
}

/* os.path.join(base, name) */
static char *join(const char *base, const char *name)
{
    size_t lb = strlen(base), ln = strlen(name);
    int sep = lb > 0 && base[lb - 1] != '/';
    char *p = malloc(lb + sep + ln + 1);
    if (!p)
        return NULL;
    memcpy(p, base, lb);
    if (sep)
        p[lb] = '/';
    memcpy(p + lb + sep, name, ln + 1);
    return p;
}

static int has_suffix(const char *name, const char *list)
{
    size_t n = strlen(name);
    for (const char *s = list; *s; s += strlen(s) + 1) {
        size_t k = strlen(s);
        if (n >= k && memcmp(name + n - k, s, k) == 0)
            return 1;
    }
    return 0;
}

struct listing {
    struct entry *files, *dirs;
    size_t n_files, n_dirs;
};

static void free_entries(struct entry *e, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(e[i].name);
    free(e);
}

/* Scanner._walk_list: (files, subdirectories) of ``path``, each sorted; 0 when it could not
 * be listed (an 'X' record, counted unreadable).  Never-ELF names are counted here. */
static int list_dir(struct walk *w, struct task *t, const char *path, struct listing *out)
{
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    if (fd < 0) {
        int err = errno;
        if (w->record)
            record_stat(t, path);
        t->unreadable++;
        put_record(&t->out, 'X', path, err, NULL, 0, 0);
        return 0;
    }
    if (w->record && fstat(fd, &st) == 0)
        put_record(&t->out, 'D', path, 0, &st, 0, 0);
    size_t cap_f = 0, cap_d = 0;
    long long never = 0; /* counted once the listing is whole: scandir raises before */
    char chunk[32768];
    int failed = 0;
    while (!failed) {
        long got = syscall(SYS_getdents64, fd, chunk, sizeof chunk);
        if (got <= 0) {
            if (got < 0)
                failed = errno ? errno : EIO;
            break;
        }
        for (long at = 0; at < got && !failed;) {
            struct linux_dirent64 *d = (struct linux_dirent64 *)(chunk + at);
            at += d->d_reclen;
            const char *name = d->d_name;
            if (name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0')))
                continue;
            unsigned char type = d->d_type;
            int is_dir = 0, is_link = 0;
            struct stat lst;
            char *full = NULL;
            if (type == DT_UNKNOWN) { /* (file systems without d_type: as DirEntry, an lstat) */
                full = join(path, name);
                if (full && lstat(full, &lst) == 0)
                    type = S_ISLNK(lst.st_mode) ? DT_LNK : S_ISDIR(lst.st_mode) ? DT_DIR
                           : S_ISREG(lst.st_mode) ? DT_REG : DT_FIFO; /* (any other: not plain) */
            }
            if (type == DT_DIR) {
                is_dir = 1;
            } else if (type == DT_LNK) {
                /* DirEntry.is_dir() follows the link: a directory behind it is left out */
                is_link = 1;
                if (!full)
                    full = join(path, name);
                struct stat target;
                if (full && stat(full, &target) == 0 && S_ISDIR(target.st_mode)) {
                    is_dir = 1;
                    if (w->record) /* that it is a directory is all the walk learnt of it */
                        put_record(&t->out, 'W', full, 0, &target, 0, 0);
                }
            }
            struct entry **list = NULL;
            size_t *count = NULL, *cap = NULL;
            if (is_dir) {
                if (!is_link) {
                    list = &out->dirs, count = &out->n_dirs, cap = &cap_d;
                    type = DT_DIR;
                }
            } else if (has_suffix(name, w->never)) {
                never++;
            } else {
                list = &out->files, count = &out->n_files, cap = &cap_f;
            }
            free(full);
            if (!list)
                continue;
            if (*count == *cap) {
                size_t grown_cap = *cap ? *cap * 2 : 64;
                struct entry *grown = realloc(*list, grown_cap * sizeof *grown);
                if (!grown) {
                    failed = ENOMEM;
                    break;
                }
                *list = grown;
                *cap = grown_cap;
            }
            (*list)[*count].name = strdup(name);
            (*list)[*count].type = type;
            if (!(*list)[*count].name) {
                failed = ENOMEM;
                break;
            }
            (*count)++;
        }
    }
    close(fd);
    if (failed) { /* a listing that failed half-way is no listing (scandir raised) */
        free_entries(out->files, out->n_files);
        free_entries(out->dirs, out->n_dirs);
        memset(out, 0, sizeof *out);
        if (failed == ENOMEM) {
            w->nomem = 1;
            return 0;
        }
        t->unreadable++;
        put_record(&t->out, 'X', path, failed, NULL, 0, 0);
        return 0;
    }
    t->files_n += never;
    t->skipped += never;
    if (out->n_files > 1)
        qsort(out->files, out->n_files, sizeof *out->files, entry_compare);
    if (out->n_dirs > 1)
        qsort(out->dirs, out->n_dirs, sizeof *out->dirs, entry_compare);
    return 1;
}

/* (dev, inode) -> kind of the link targets sniffed in a task: open addressing, grown at
 * half full (a tree of many links must not cost a scan of every earlier one per link) */
static size_t seen_slot(const struct task *t, unsigned long long dev, unsigned long long ino)
{
    unsigned long long h = (dev * 0x9E3779B97F4A7C15ULL) ^ (ino * 0xC2B2AE3D27D4EB4FULL);
    size_t mask = t->seen_cap - 1, i = (size_t)(h ^ (h >> 29)) & mask;
    while (t->seen_kinds[i] && (t->seen_keys[2 * i] != dev || t->seen_keys[2 * i + 1] != ino))
        i = (i + 1) & mask;
    return i;
}

static int seen_get(struct task *t, const struct stat *st)
{
    if (!t->seen_cap)
        return 0;
    return t->seen_kinds[seen_slot(t, (unsigned long long)st->st_dev, (unsigned long long)st->st_ino)];
}

static void seen_put(struct task *t, const struct stat *st, int kind)
{
    if (2 * (t->seen_len + 1) > t->seen_cap) {
        size_t cap = t->seen_cap ? t->seen_cap * 2 : 64;
        unsigned long long *keys = calloc(2 * cap, sizeof *keys);
        unsigned char *kinds = calloc(cap, 1);
        if (!keys || !kinds) { /* (a cache: without it the file is only read again) */
            free(keys);
            free(kinds);
            return;
        }
        struct task grown = *t;
        grown.seen_keys = keys;
        grown.seen_kinds = kinds;
        grown.seen_cap = cap;
        for (size_t i = 0; i < t->seen_cap; i++)
            if (t->seen_kinds[i]) {
                size_t at = seen_slot(&grown, t->seen_keys[2 * i], t->seen_keys[2 * i + 1]);
                keys[2 * at] = t->seen_keys[2 * i];
                keys[2 * at + 1] = t->seen_keys[2 * i + 1];
                kinds[at] = t->seen_kinds[i];
            }
        free(t->seen_keys);
        free(t->seen_kinds);
        t->seen_keys = keys;
        t->seen_kinds = kinds;
        t->seen_cap = cap;
    }
    size_t at = seen_slot(t, (unsigned long long)st->st_dev, (unsigned long long)st->st_ino);
    if (!t->seen_kinds[at])
        t->seen_len++;
    t->seen_keys[2 * at] = (unsigned long long)st->st_dev;
    t->seen_keys[2 * at + 1] = (unsigned long long)st->st_ino;
    t->seen_kinds[at] = (unsigned char)kind;
}

/* _sniff: 1 ELF, 2 other, or -errno.  *st is filled (fstat) when ``record`` (before the
 * read: a file changed after its recorded stat must look changed to the next check, never
 * the other way) or when it is ELF (after: only then is its stat wanted). */
static int sniff(const char *path, struct stat *st, int record, int *have_stat)
{
    *have_stat = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -(errno ? errno : EIO);
    if (record && fstat(fd, st) == 0)
        *have_stat = 1;
    unsigned char magic[4];
    ssize_t got;
    do
        got = read(fd, magic, 4);
    while (got < 0 && errno == EINTR);
    int kind = got < 0 ? -(errno ? errno : EIO) : (got == 4 && memcmp(magic, "\177ELF", 4) == 0) ? 1 : 2;
    if (kind == 1 && !*have_stat && fstat(fd, st) == 0)
        *have_stat = 1;
    close(fd);
    return kind;
}

/* Scanner._walk_files over one directory's files */
static void walk_files(struct walk *w, struct task *t, const char *dir, struct entry *files, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char *path = join(dir, files[i].name);
        if (!path) {
            w->nomem = 1;
            return;
        }
        t->files_n++;
        int plain = files[i].type == DT_REG;
        struct stat st;
        int have = 0;
        if (!plain) {
            if (stat(path, &st) != 0) {
                int err = errno;
                if (w->record)
                    put_record(&t->out, 'S', path, err ? err : -1, NULL, 0, 0);
                if (err == ELOOP) {
                    t->unreadable++;
                    put_record(&t->out, 'L', path, err, NULL, 0, 0);
                } else {
                    t->skipped++; /* a dangling link: nothing to check */
                }
                free(path);
                continue;
            }
            have = 1;
            if (w->record)
                put_record(&t->out, 'S', path, 0, &st, 0, 0);
            if (!S_ISREG(st.st_mode) || st.st_size < 16) {
                t->skipped++;
                free(path);
                continue;
            }
        }
        int config = has_suffix(files[i].name, w->config);
        int kind = have ? seen_get(t, &st) : 0;
        struct stat sniffed;
        int sniffed_stat = 0;
        if (kind == 0) {
            kind = sniff(path, &sniffed, w->record, &sniffed_stat);
            if (w->record) {
                if (sniffed_stat)
                    put_record(&t->out, 'S', path, 0, &sniffed, 0, 0);
                else if (kind < 0)
                    record_stat(t, path);
            }
            if (kind > 0 && have)
                seen_put(t, &st, kind);
        }
        if (kind == 1 && !have) {
            if (!sniffed_stat) { /* (fstat of an open file does not fail; as the stat after) */
                t->unreadable++;
                put_record(&t->out, 'U', path, EIO, NULL, 0, 0);
                free(path);
                continue;
            }
            st = sniffed;
            have = 1;
            if (st.st_size < 16)
                kind = 2;
        }
        if (config) {
            /* the caller asks _is_seedance_config, then counts it as this says */
            put_record(&t->out, 'C', path, kind < 0 ? -kind : 0, kind == 1 ? &st : NULL, plain, kind == 1);
        } else if (kind == 1) {
            put_record(&t->out, 'E', path, 0, &st, plain, 1);
        } else if (kind < 0) {
            t->unreadable++;
            put_record(&t->out, 'U', path, -kind, NULL, 0, 0);
        } else {
            t->skipped++;
        }
        free(path);
    }
}

/* Scanner._walk_tree: the subtree at ``root``, top-down */
static void walk_tree(struct walk *w, struct task *t, const char *root)
{
    size_t cap = 64, n = 0;
    char **stack = malloc(cap * sizeof *stack);
    char *first = strdup(root);
    if (!stack || !first) {
        free(stack);
        free(first);
        w->nomem = 1;
        return;
    }
    stack[n++] = first;
    while (n > 0 && !w->nomem) {
        char *base = stack[--n];
        struct listing l;
        if (list_dir(w, t, base, &l)) {
            walk_files(w, t, base, l.files, l.n_files);
            if (n + l.n_dirs > cap) {
                while (n + l.n_dirs > cap)
                    cap *= 2;
                char **grown = realloc(stack, cap * sizeof *grown);
                if (!grown)
                    w->nomem = 1;
                else
                    stack = grown;
            }
            for (size_t i = l.n_dirs; i-- > 0 && !w->nomem;) { /* reversed: the first is walked next */
                char *sub = join(base, l.dirs[i].name);
                if (!sub)
                    w->nomem = 1;
                else
                    stack[n++] = sub;
            }
            free_entries(l.files, l.n_files);
            free_entries(l.dirs, l.n_dirs);
        }
        free(base);
    }
    while (n > 0)
        free(stack[--n]);
    free(stack);
}

/* ---- pieces and threads ----------------------------------------------------------------- */

static struct task *add_task(struct walk *w, int kind, char *path, struct entry *files, size_t n_files)
{
    if (w->n_tasks == w->cap_tasks) {
        size_t cap = w->cap_tasks ? w->cap_tasks * 2 : 64;
        struct task *grown = realloc(w->tasks, cap * sizeof *grown);
        if (!grown) {
            w->nomem = 1;
            free(path);
            return NULL;
        }
        w->tasks = grown;
        w->cap_tasks = cap;
    }
    struct task *t = &w->tasks[w->n_tasks++];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->path = path;
    t->files = files;
    t->n_files = n_files;
    return t;
}

static void keep_listing(struct walk *w, struct listing *l)
{
    if (w->n_listings + 2 > w->cap_listings) {
        size_t cap = w->cap_listings ? w->cap_listings * 2 : 64;
        struct entry **grown = realloc(w->listings, cap * sizeof *grown);
        size_t *sizes = grown ? realloc(w->listing_sizes, cap * sizeof *sizes) : NULL;
        if (grown)
            w->listings = grown;
        if (!sizes) {
            w->nomem = 1;
            free_entries(l->files, l->n_files);
            free_entries(l->dirs, l->n_dirs);
            return;
        }
        w->listing_sizes = sizes;
        w->cap_listings = cap;
    }
    w->listings[w->n_listings] = l->files;
    w->listing_sizes[w->n_listings++] = l->n_files;
    w->listings[w->n_listings] = l->dirs;
    w->listing_sizes[w->n_listings++] = l->n_dirs;
}

#define CHUNK 256

/* the directory's files in chunks of CHUNK (kind 1 tasks) */
static void add_file_chunks(struct walk *w, const char *dir, struct listing *l)
{
    for (size_t at = 0; at < l->n_files && !w->nomem; at += CHUNK) {
        char *path = strdup(dir);
        if (!path) {
            w->nomem = 1;
            return;
        }
        add_task(w, 1, path, l->files + at, l->n_files - at < CHUNK ? l->n_files - at : CHUNK);
    }
}

static void run_task(struct walk *w, struct task *t)
{
    if (t->kind == 1)
        walk_files(w, t, t->path, t->files, t->n_files);
    else if (t->kind == 2)
        walk_tree(w, t, t->path);
}

static void *worker(void *arg)
{
    struct walk *w = arg;
    for (;;) {
        size_t i = __atomic_fetch_add(&w->next, 1, __ATOMIC_RELAXED);
        if (i >= w->n_tasks || w->nomem)
            return NULL;
        run_task(w, &w->tasks[i]);
    }
}

int sd_walk_record_size(void)
{
    return (int)sizeof(struct sd_walk_record);
}

int sd_walk(const char *root, int record, const char *never_suffixes, const char *config_suffixes, int threads,
            struct sd_walk_result *result)
{
    memset(result, 0, sizeof *result);
    struct walk w;
    memset(&w, 0, sizeof w);
    w.record = record;
    w.never = never_suffixes;
    w.config = config_suffixes;
    if (threads <= 1) {
        struct task *t = add_task(&w, 2, strdup(root), NULL, 0);
        if (t && t->path)
            walk_tree(&w, t, root);
        else
            w.nomem = 1;
    } else {
        /* Scanner._walk_pieces: the top two levels listed here, in order; what they hold
         * (chunks of files, the subtrees two levels down) taken by whichever thread is free */
        struct task *top = add_task(&w, 0, strdup(root), NULL, 0);
        struct listing l;
        if (top && list_dir(&w, top, root, &l)) {
            keep_listing(&w, &l);
            add_file_chunks(&w, root, &l);
            for (size_t i = 0; i < l.n_dirs && !w.nomem; i++) {
                char *sub = join(root, l.dirs[i].name);
                struct task *done = sub ? add_task(&w, 0, sub, NULL, 0) : NULL;
                if (!done) {
                    w.nomem = 1;
                    break;
                }
                struct listing sl;
                /* (done may move when tasks grow: index it again after adding) */
                size_t done_at = w.n_tasks - 1;
                if (!list_dir(&w, &w.tasks[done_at], sub, &sl))
                    continue;
                keep_listing(&w, &sl);
                add_file_chunks(&w, sub, &sl);
                for (size_t k = 0; k < sl.n_dirs && !w.nomem; k++) {
                    char *deeper = join(sub, sl.dirs[k].name);
                    if (!deeper)
                        w.nomem = 1;
                    else
                        add_task(&w, 2, deeper, NULL, 0);
                }
            }
        }
        size_t extra = (size_t)threads - 1;
        pthread_t ids[16];
        if (extra > 16)
            extra = 16;
        size_t started = 0;
        for (; started < extra; started++)
            if (pthread_create(&ids[started], NULL, worker, &w) != 0)
                break;
        worker(&w);
        for (size_t i = 0; i < started; i++)
            pthread_join(ids[i], NULL);
    }
    struct buf all = {0};
    for (size_t i = 0; i < w.n_tasks; i++) {
        struct task *t = &w.tasks[i];
        if (t->out.failed)
            w.nomem = 1;
        if (!w.nomem && t->out.len)
            buf_put(&all, t->out.data, t->out.len);
        result->files += t->files_n;
        result->skipped += t->skipped;
        result->unreadable += t->unreadable;
        free(t->out.data);
        free(t->path);
        free(t->seen_keys);
        free(t->seen_kinds);
    }
    free(w.tasks);
    for (size_t i = 0; i < w.n_listings; i++)
        free_entries(w.listings[i], w.listing_sizes[i]);
    free(w.listings);
    free(w.listing_sizes);
    if (w.nomem || all.failed) {
        free(all.data);
        memset(result, 0, sizeof *result);
        return SD_WALK_NOMEM;
    }
    result->data = all.data;
    result->len = all.len;
    return SD_WALK_OK;
}

void sd_walk_free(struct sd_walk_result *result)
{
    free(result->data);
    result->data = NULL;
    result->len = 0;
}
