/* sd_inputs_changed: the check cache's validation (agent/collect/inputs.py), in C.
 *
 * A cached check is believed only when every file and directory it read is as it was:
 * ~5,000 stat calls for a check of /usr/lib/x86_64-linux-gnu.  In Python each os.stat
 * builds a 19-field stat_result with float times (~3 us here, against ~1.2 us for the
 * system call itself), and the validation was most of a cached check (issue 13).  It lives
 * in the package's one C extension (this file is compiled with fastelf.c) so there is no
 * second build; inputs.py keeps a Python twin that the tests compare it with.
 *
 * The blob is a sequence of records, each a fixed header (struct sd_input_record, native
 * byte order: it is written and read on the same host) followed by path_len bytes of
 * path, no NUL.  Nothing in it is trusted: every length is bounds-checked. */
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>

#include "fastelf.h"

long sd_inputs_changed(const unsigned char *blob, size_t len, size_t *validated)
{
    char path[PATH_MAX + 1];
    size_t at = 0, count = 0;
    *validated = 0;
    while (at < len) {
        struct sd_input_record rec;
        struct stat st;
        int failed;
        if (len - at < sizeof rec)
            return -2;
        memcpy(&rec, blob + at, sizeof rec);
        at += sizeof rec;
        if (rec.path_len == 0 || rec.path_len > PATH_MAX || len - at < rec.path_len)
            return -2;
        memcpy(path, blob + at, rec.path_len);
        path[rec.path_len] = '\0';
        at += rec.path_len;
        if (memchr(path, '\0', rec.path_len) != NULL)
            return -2;
        failed = rec.follow ? stat(path, &st) : lstat(path, &st);
        if (failed) {
            if (rec.err != (errno ? errno : -1))
                return (long)count;
        } else if (rec.err != 0 || (unsigned long long)st.st_dev != rec.dev ||
                   (unsigned long long)st.st_ino != rec.ino || (unsigned long long)st.st_mode != rec.mode ||
                   (long long)st.st_size != rec.size ||
                   (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec != rec.mtime_ns ||
                   (long long)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec != rec.ctime_ns) {
            return (long)count;
        }
        count++;
        *validated = count;
    }
    return -1;
}
