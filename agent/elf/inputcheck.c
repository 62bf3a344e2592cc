/* sd_inputs_changed: the check cache's validation (agent/collect/inputs.py), in C.
 *
 * A cached check is believed only when every file and directory it read is as it was:
 * thousands of stat calls for a check of /usr/lib/x86_64-linux-gnu.  In Python each os.stat
 * also builds a 19-field stat_result with float times, which costs more than the system
 * call itself, and the validation would be most of a cached check.  It lives
 * in the package's one C extension (this file is compiled with fastelf.c) so there is no
 * second build; inputs.py keeps a Python twin that the tests compare it with.
 *
 * The blob is a sequence of records, each a fixed header (struct sd_input_record, native
 * byte order: it is written and read on the same host) followed by path_len bytes of
 * path, no NUL.  Nothing in it is trusted: every length is bounds-checked. */
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <pthread.h>
#include <sys/stat.h>

#include "fastelf.h"

/* One record at ``at`` (bounds-checked): 1 when the path is as recorded, 0 when not, -1
 * when the record is malformed; *next is set past it. */
static int check_one(const unsigned char *blob, size_t len, size_t at, size_t *next)
{
    char path[PATH_MAX + 1];
    struct sd_input_record rec;
    struct stat st;
    if (len - at < sizeof rec)
        return -1;
    memcpy(&rec, blob + at, sizeof rec);
    at += sizeof rec;
    if (rec.path_len == 0 || rec.path_len > PATH_MAX || len - at < rec.path_len)
        return -1;
    memcpy(path, blob + at, rec.path_len);
    path[rec.path_len] = '\0';
    *next = at + rec.path_len;
    if (memchr(path, '\0', rec.path_len) != NULL)
        return -1;
    if (rec.follow ? stat(path, &st) : lstat(path, &st))
        return rec.err == (errno ? errno : -1);
    if (rec.err != 0 || (unsigned long long)st.st_dev != rec.dev || (unsigned long long)st.st_ino != rec.ino ||
        (unsigned long long)st.st_mode != rec.mode)
        return 0;
    if (rec.weak)  /* a directory stat'ed, not listed: what it is, not what it holds */
        return 1;
    return (long long)st.st_size == rec.size &&
           (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec == rec.mtime_ns &&
           (long long)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec == rec.ctime_ns;
}

/* Records [first, last) from byte offset ``at``: -1 when all match, else the index of the
 * first that does not (or -2: malformed). */
struct span { const unsigned char *blob; size_t len, at, first, last; long result; };

static void *check_span(void *arg)
{
    struct span *span = arg;
    size_t at = span->at;
    span->result = -1;
    for (size_t index = span->first; index < span->last; index++) {
        size_t next = at;
        int ok = check_one(span->blob, span->len, at, &next);
        if (ok != 1) {
            span->result = ok < 0 ? -2 : (long)index;
            return NULL;
        }
        at = next;
    }
    return NULL;
}

long sd_inputs_changed(const unsigned char *blob, size_t len, size_t *validated)
{
    /* The offsets are found first (memory only), then the stats are split between this
     * thread and one more above SPLIT_MIN records: the system calls (a path walk in the
     * kernel each) are the whole cost, and a check runs where a second core is usually idle. */
    enum { SPLIT_MIN = 1024 };
    size_t count = 0, at = 0, half_at = 0;
    struct sd_input_record rec;
    *validated = 0;
    while (at < len) {
        if (len - at < sizeof rec)
            return -2;
        memcpy(&rec, blob + at, sizeof rec);
        if (rec.path_len == 0 || rec.path_len > PATH_MAX || len - at - sizeof rec < rec.path_len)
            return -2;
        at += sizeof rec + rec.path_len;
        count++;
    }
    size_t half = count >= SPLIT_MIN ? count / 2 : count;
    at = 0;
    for (size_t index = 0; index < half; index++) {
        memcpy(&rec, blob + at, sizeof rec);
        at += sizeof rec + rec.path_len;
    }
    half_at = at;
    struct span first = {blob, len, 0, 0, half, -1}, second = {blob, len, half_at, half, count, -1};
    pthread_t other;
    int threaded = half < count && pthread_create(&other, NULL, check_span, &second) == 0;
    check_span(&first);
    if (threaded)
        pthread_join(other, NULL);
    else if (half < count)
        check_span(&second);
    if (first.result != -1)
        return first.result;
    if (second.result != -1)
        return second.result;
    *validated = count;
    return -1;
}
