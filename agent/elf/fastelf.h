/* fastelf: the C twin of agent/elf/reader.py's read_elf(path) without symbols or fatbins.
 *
 * Why: a check of /usr/lib parses hundreds of objects, and in Python the header,
 * program-header, section-name, PT_DYNAMIC, verneed, verdef and note parsing is a
 * struct.unpack and an object per field, a large share of the command.  The Python reader
 * stays the reference: the tests compare the two on every ELF of the host and on thousands
 * of mutated files.
 *
 * The region between the cdef markers is parsed by cffi (agent/elf/build_fastelf.py), so
 * the Python side can never disagree with this layout.
 */
#ifndef SEEDANCE_FASTELF_H
#define SEEDANCE_FASTELF_H

#include <stddef.h>

/* cdef-begin */
/* Bumped whenever the result layout or the meaning of a field changes: the Python side
 * refuses a module built from another layout (reader.py, _c_reader). */
#define SD_FASTELF_ABI 7

/* sd_fastelf_read's return codes */
#define SD_FASTELF_OK 0
#define SD_FASTELF_ERROR 1     /* ELFError: message in error[] (without the "path: " prefix) */
#define SD_FASTELF_FALLBACK 2  /* the output buffers are too small, or an OS condition the
                                  Python reader reports its own way: use the Python reader */

/* Strings land in `strings`, each followed by a NUL, in this order:
 *   interpreter (if has_interp)
 *   n_sections section names (every name read, duplicates included, in header order)
 *   n_needed DT_NEEDED names
 *   soname (if has_soname), rpath (if has_rpath), runpath (if has_runpath), unsplit
 *   build id as lower-case hex (if has_build_id; may be empty)
 *   for each of n_verneed entries: vn_counts[i] versions, each prefixed by '1' (weak) or
 *     '0', then the entry's file name
 *   n_verdef version definition names (the base entry excluded)
 */
struct sd_fastelf_result {
    int elf_class;
    int little_endian;
    int machine;
    int osabi;
    int e_type;
    int has_sections;
    int has_dynamic;
    int has_interp;
    int has_soname;
    int has_rpath;
    int has_runpath;
    int has_build_id;
    unsigned long long flags;
    unsigned long long flags_1;
    unsigned int n_sections;
    unsigned int n_needed;
    unsigned int n_verneed;
    unsigned int n_verdef;
    size_t strings_len;
    /* properties.py x86_isa_needed of the same image (GNU_PROPERTY_X86_ISA_1_NEEDED), on OK */
    unsigned int x86_isa_needed;
    char error[512];
};

/* The dynamic symbols (read_elf(symbols=True or a tuple of name prefixes)), in table
 * order, LOCAL ones left out as reader.py does.  Allocated by sd_fastelf_read, released
 * by sd_fastelf_free_symbols (also after an error).
 *   names: `count` names, each followed by a NUL
 *   records: 8 bytes per symbol, native order: bind, type, defined, hidden (one byte
 *     each), then a uint32 version slot: 0 for no version, k for the k-th string of
 *     `versions` (n_versions NUL-terminated names) */
struct sd_fastelf_symbols {
    size_t count;
    char *names;
    size_t names_len;
    size_t names_cap;
    unsigned char *records;
    size_t records_cap;
    char *versions;
    size_t versions_len;
    size_t versions_cap;
    unsigned int n_versions;
};

#define SD_FASTELF_NO_SYMBOLS 0
#define SD_FASTELF_ALL_SYMBOLS 1
#define SD_FASTELF_PREFIXED_SYMBOLS 2  /* names starting with one of the prefixes */
#define SD_FASTELF_EXPORTED_PREFIXED 3  /* of those, the defined ones not hidden (exports) */

int sd_fastelf_abi(void);
/* scratch: a file no larger than scratch_cap is read into it instead of being mapped */
int sd_fastelf_read(const char *path, struct sd_fastelf_result *out, char *strings, size_t strings_cap,
                    unsigned int *vn_counts, size_t vn_counts_cap, int want_symbols, const char *prefix_bytes,
                    const size_t *prefix_lens, size_t n_prefixes, struct sd_fastelf_symbols *symbols,
                    unsigned char *scratch, size_t scratch_cap);
void sd_fastelf_free_symbols(struct sd_fastelf_symbols *symbols);

/* inputcheck.c: the check cache's inputs, stat'ed again (agent/collect/inputs.py).
 * Returns -1 when every record matches, the index of the first that does not, or -2 when
 * the blob is malformed; *validated counts the records that matched. */
struct sd_input_record {
    unsigned int path_len;
    int follow;                /* 1: stat (follow links), 0: lstat */
    int err;                   /* 0: the path existed; else the errno its stat gave */
    int weak;                  /* 1: compare dev, ino and mode only (a directory not listed) */
    unsigned long long dev, ino, mode;
    long long size, mtime_ns, ctime_ns;
};
long sd_inputs_changed(const unsigned char *blob, size_t len, size_t *validated);

/* treewalk.c: the ELF files under a directory, in collect/scan.py's walk order.  Records
 * (this header, then path_len bytes of path, no NUL), kind:
 *   'E' an ELF file (stat: its fstat; plain: a regular file, not reached through a link)
 *   'C' a file named like a config (elf: it is ELF, with its stat; err: it could not be read)
 *   'U' a file that could not be read (err), 'L' a link in a loop (err ELOOP)
 *   'X' a directory that could not be listed (err)
 *   'D' a directory listed, 'S' a path stat'ed or opened (stat, or err), 'W' a link's target
 *   found to be a directory (only what it is counts): with ``record`` only */
struct sd_walk_record {
    unsigned int path_len;
    unsigned char kind, plain, elf, has_stat;
    int err;
    int reserved;
    unsigned long long dev, ino, mode, nlink, uid, gid, rdev;
    long long size, blksize, blocks, atime_ns, mtime_ns, ctime_ns;
};
struct sd_walk_result {
    unsigned char *data;
    size_t len;
    long long files, skipped, unreadable;
};
#define SD_WALK_OK 0
#define SD_WALK_NOMEM 1
int sd_walk_record_size(void);
/* suffix lists: NUL-separated, ended by an empty one ("a\0b\0\0") */
int sd_walk(const char *root, int record, const char *never_suffixes, const char *config_suffixes, int threads,
            struct sd_walk_result *result);
void sd_walk_free(struct sd_walk_result *result);

/* dpkgindex.c: the dpkg file lists read and indexed by file name on a thread
 * (collect/practice.py's _dpkg_by_name says what a match is) */
#define SD_DPKG_OK 0
#define SD_DPKG_FALLBACK 1
struct sd_dpkg;
struct sd_dpkg_input {
    int err; /* 0, or the errno of its stat */
    unsigned long long dev, ino, mode;
    long long size, mtime_ns, ctime_ns;
};
struct sd_dpkg *sd_dpkg_start(const char *dir);
int sd_dpkg_wait(struct sd_dpkg *d);
int sd_dpkg_count(struct sd_dpkg *d);
const char *sd_dpkg_name(struct sd_dpkg *d, int i);
struct sd_dpkg_input *sd_dpkg_input(struct sd_dpkg *d, int i);
long sd_dpkg_find(struct sd_dpkg *d, const char *name, size_t len, int *lists, const char **lines, size_t *lens,
                  long cap);
void sd_dpkg_free(struct sd_dpkg *d);
/* cdef-end */

#endif
