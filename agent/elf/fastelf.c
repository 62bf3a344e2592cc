/* fastelf: read_elf(path) of agent/elf/reader.py in C, for the no-symbols, no-fatbin case.
 *
 * Every function here mirrors a method of reader.py's _Parser, in the same order, with
 * the same checks and the same messages: the Python reader is the reference, and
 * tests/unit/test_elf_fastread.py compares the two on every ELF of the host and on
 * thousands of mutated files.  Offsets are computed in __int128 ("wide") because Python's
 * ints never wrap: a hostile p_offset + p_filesz must overflow neither here nor there.
 *
 * Every read is bounds-checked against the mapping; every loop is capped (the caps are
 * reader.py's); the output buffers are bounded and a file whose strings do not fit makes
 * the caller fall back to the Python reader (SD_FASTELF_FALLBACK), never a longer run.
 */
#define _GNU_SOURCE
#include "fastelf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef __SIZEOF_INT128__
#error "fastelf compares offsets as unbounded integers and needs __int128"
#endif

typedef __int128 wide;

/* reader.py's sanity caps */
#define MAX_DYN_ENTRIES (1 << 16)
#define MAX_VER_ENTRIES (1 << 16)
#define MAX_STRING (1 << 16)

#define PT_LOAD 1
#define PT_DYNAMIC 2
#define PT_INTERP 3
#define PT_NOTE 4
#define SHT_NOTE 7
#define DT_NULL 0
#define DT_NEEDED 1
#define DT_HASH 4
#define DT_STRTAB 5
#define DT_SYMTAB 6
#define DT_STRSZ 10
#define DT_SYMENT 11
#define DT_SONAME 14
#define DT_RPATH 15
#define DT_RUNPATH 29
#define DT_FLAGS 30
#define DT_GNU_HASH 0x6FFFFEF5
#define DT_VERSYM 0x6FFFFFF0
#define DT_FLAGS_1 0x6FFFFFFB
#define DT_VERDEF 0x6FFFFFFC
#define DT_VERDEFNUM 0x6FFFFFFD
#define DT_VERNEED 0x6FFFFFFE
#define DT_VERNEEDNUM 0x6FFFFFFF
#define VER_FLG_BASE 0x1
#define VER_FLG_WEAK 0x2
#define NT_GNU_BUILD_ID 3
#define NT_GNU_PROPERTY_TYPE_0 5
#define PT_GNU_PROPERTY 0x6474e553u
#define GNU_PROPERTY_X86_ISA_1_NEEDED 0xc0008002u
#define EM_X86_64 62
#define MAX_PROPERTY_SEGMENT 65536  /* properties.py _MAX_SEGMENT */
#define STB_LOCAL 0
#define SHN_UNDEF 0
/* the symbols' output may grow this far before the Python reader takes over */
#define MAX_SYMBOL_OUTPUT ((size_t)1 << 30)

#define OK SD_FASTELF_OK
#define ERR SD_FASTELF_ERROR
#define FALLBACK SD_FASTELF_FALLBACK
#define TRY(expr)              \
    do {                       \
        int rc_ = (expr);      \
        if (rc_ != OK)         \
            return rc_;        \
    } while (0)

struct parser {
    const unsigned char *data;
    wide size;
    int is64;
    int le;
    struct sd_fastelf_result *out;
    char *strings;
    size_t cap;
    unsigned int *vn_counts;
    size_t vn_cap;
    /* program headers (validated in bounds by program_headers) */
    wide phoff;
    wide phentsize;
    unsigned phnum;
    /* the build-id note's descriptor, once found */
    int build_id_found;
    wide build_id_off;
    wide build_id_len;
    /* symbols: what is wanted, where they go */
    int want_symbols;
    const char *prefix_bytes;
    const size_t *prefix_lens;
    size_t n_prefixes;
    unsigned char prefix_first[256];  /* 1 for each byte some prefix starts with (all for "") */
    struct sd_fastelf_symbols *syms;
    /* the first section named .dynsym (reader.py's sections dict keeps the first) */
    int has_dynsym;
    wide dynsym_size;
    wide dynsym_entsize;
    /* version index (& 0x7FFF) -> its name in the file, as reader.py's version_names;
     * n_version_names entries, grown to the highest index seen (a few dozen in real
     * files: a table for all 32768 cost a 900 KB memset per object) */
    struct version_name *version_names;
    size_t n_version_names;
    unsigned *version_slots;  /* version index -> 1 + its place in syms->versions, 0: none yet */
};

struct version_name {
    int set;
    size_t start;
    size_t len;
};

/* Python's f"{value:#x}" */
static const char *hex(char buf[48], wide value)
{
    char tmp[40];
    int n = 0;
    unsigned __int128 u = value < 0 ? -(unsigned __int128)value : (unsigned __int128)value;
    do {
        tmp[n++] = "0123456789abcdef"[(unsigned)(u & 15)];
        u >>= 4;
    } while (u);
    char *p = buf;
    if (value < 0)
        *p++ = '-';
    *p++ = '0';
    *p++ = 'x';
    while (n)
        *p++ = tmp[--n];
    *p = 0;
    return buf;
}

static int fail(struct parser *p, const char *fmt, ...)
{
    int used = snprintf(p->out->error, sizeof p->out->error, "malformed ELF: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->out->error + used, sizeof p->out->error - (size_t)used, fmt, ap);
    va_end(ap);
    return ERR;
}

/* _Parser.unpack's check: the whole field inside the file */
static int need(struct parser *p, wide offset, int nbytes)
{
    if (offset < 0 || offset + nbytes > p->size) {
        char a[48], b[48];
        return fail(p, "read of %d bytes at %s past end of file (%s)", nbytes, hex(a, offset), hex(b, p->size));
    }
    return OK;
}

/* an unsigned field of nbytes at offset (already checked) in the file's byte order */
static uint64_t get(const struct parser *p, wide offset, int nbytes)
{
    const unsigned char *b = p->data + (size_t)offset;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (p->le) {  /* the common case: a native-order file, one unaligned load */
        switch (nbytes) {
        case 1: return b[0];
        case 2: { uint16_t v; memcpy(&v, b, 2); return v; }
        case 4: { uint32_t v; memcpy(&v, b, 4); return v; }
        case 8: { uint64_t v; memcpy(&v, b, 8); return v; }
        }
    }
#endif
    uint64_t value = 0;
    if (p->le)
        for (int i = nbytes - 1; i >= 0; i--)
            value = value << 8 | b[i];
    else
        for (int i = 0; i < nbytes; i++)
            value = value << 8 | b[i];
    return value;
}

/* _Parser.cstring: [*start, *start + *len) is the string at offset, below limit */
static int cstring(struct parser *p, wide offset, wide limit, size_t *start, size_t *len)
{
    wide end_limit = limit < p->size ? limit : p->size;
    char a[48];
    if (offset < 0 || offset >= end_limit)
        return fail(p, "string offset %s outside its table", hex(a, offset));
    wide search_end = offset + MAX_STRING < end_limit ? offset + MAX_STRING : end_limit;
    const unsigned char *nul = memchr(p->data + (size_t)offset, 0, (size_t)(search_end - offset));
    if (!nul)
        return fail(p, "unterminated string at %s", hex(a, offset));
    *start = (size_t)offset;
    *len = (size_t)(nul - (p->data + (size_t)offset));
    return OK;
}

/* append one output string (prefix < 0: none) and its NUL; FALLBACK when it does not fit */
static int emit(struct parser *p, const void *bytes, size_t len, int prefix)
{
    size_t used = p->out->strings_len;
    size_t want = len + 1 + (prefix >= 0);
    if (want > p->cap - used)
        return FALLBACK;
    char *dst = p->strings + used;
    if (prefix >= 0)
        *dst++ = (char)prefix;
    memcpy(dst, bytes, len);
    dst[len] = 0;
    p->out->strings_len = used + want;
    return OK;
}

static int emit_cstring(struct parser *p, wide offset, wide limit, int prefix)
{
    size_t start, len;
    TRY(cstring(p, offset, limit, &start, &len));
    return emit(p, p->data + start, len, prefix);
}

/* --- program headers ------------------------------------------------------------------ */

struct segment {
    uint32_t type;
    wide offset;
    wide vaddr;
    wide filesz;
};

static void segment_at(const struct parser *p, unsigned index, struct segment *seg)
{
    wide base = p->phoff + (wide)index * p->phentsize;
    seg->type = (uint32_t)get(p, base, 4);
    if (p->is64) {
        seg->offset = get(p, base + 8, 8);
        seg->vaddr = get(p, base + 16, 8);
        seg->filesz = get(p, base + 32, 8);
    } else {
        seg->offset = get(p, base + 4, 4);
        seg->vaddr = get(p, base + 8, 4);
        seg->filesz = get(p, base + 16, 4);
    }
}

static int program_headers(struct parser *p, wide phoff, unsigned phentsize, unsigned phnum)
{
    p->phoff = phoff;
    p->phentsize = phentsize;
    p->phnum = 0;
    if (phnum == 0)
        return OK;
    if (phentsize < (p->is64 ? 56u : 32u))
        return fail(p, "e_phentsize %u too small", phentsize);
    if (phoff + (wide)phnum * phentsize > p->size)
        return fail(p, "program headers past end of file");
    p->phnum = phnum;
    return OK;
}

/* _Parser.vaddr_to_offset: the first PT_LOAD whose file image holds vaddr */
static int vaddr_to_offset(struct parser *p, wide vaddr, wide *offset)
{
    struct segment seg;
    for (unsigned i = 0; i < p->phnum; i++) {
        segment_at(p, i, &seg);
        if (seg.type == PT_LOAD && seg.vaddr <= vaddr && vaddr < seg.vaddr + seg.filesz) {
            *offset = seg.offset + (vaddr - seg.vaddr);
            return OK;
        }
    }
    char a[48];
    return fail(p, "address %s is in no PT_LOAD segment", hex(a, vaddr));
}

/* --- notes ---------------------------------------------------------------------------- */

/* _Parser._build_id: 1 and the descriptor's place when a GNU build-id note is found */
static int build_id(struct parser *p, wide offset, wide size, wide *desc, wide *desc_len)
{
    wide end = offset + size < p->size ? offset + size : p->size;
    while (offset + 12 <= end) {
        wide namesz = get(p, offset, 4), descsz = get(p, offset + 4, 4);
        uint32_t n_type = (uint32_t)get(p, offset + 8, 4);
        wide name_off = offset + 12;
        wide desc_off = name_off + ((namesz + 3) & ~(wide)3);
        wide next = desc_off + ((descsz + 3) & ~(wide)3);
        if (next > end || next <= offset)
            return 0;
        if (n_type == NT_GNU_BUILD_ID) {
            /* data[name_off:name_off + namesz].rstrip(b"\0") == b"GNU" */
            const unsigned char *name = p->data + (size_t)name_off;
            size_t n = (size_t)namesz;
            while (n && name[n - 1] == 0)
                n--;
            if (n == 3 && memcmp(name, "GNU", 3) == 0) {
                *desc = desc_off;
                *desc_len = descsz;
                return 1;
            }
        }
        offset = next;
    }
    return 0;
}

/* --- section headers ------------------------------------------------------------------ */

struct section {
    uint32_t type;
    int named;  /* its name was read (and emitted) */
    wide offset;
    wide size;
    wide entsize;
    size_t name_pos;  /* in p->strings */
    size_t name_len;
};

static uint32_t name_hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

/* The build id from .note* sections when no PT_NOTE held one.  reader.py keeps only the
 * first section of each name (a dict filled with setdefault), so a later section that
 * repeats an earlier name is skipped; a hash set over the emitted names finds those. */
static int section_build_id(struct parser *p, struct section *secs, unsigned n)
{
    unsigned candidates = 0;
    for (unsigned i = 0; i < n; i++)
        if (secs[i].named && secs[i].type == SHT_NOTE && secs[i].name_len >= 5 &&
            memcmp(p->strings + secs[i].name_pos, ".note", 5) == 0)
            candidates++;
    if (!candidates)
        return OK;
    size_t slots = 16;
    while (slots < 2 * (size_t)n)
        slots <<= 1;
    unsigned *table = calloc(slots, sizeof *table);
    if (!table)
        return FALLBACK;
    for (unsigned i = 0; i < n; i++) {
        if (!secs[i].named)
            continue;
        const char *name = p->strings + secs[i].name_pos;
        size_t len = secs[i].name_len;
        size_t slot = name_hash(name, len) & (slots - 1);
        int first = 1;
        while (table[slot]) {
            const struct section *other = &secs[table[slot] - 1];
            if (other->name_len == len && memcmp(p->strings + other->name_pos, name, len) == 0) {
                first = 0;
                break;
            }
            slot = (slot + 1) & (slots - 1);
        }
        if (!first)
            continue;
        table[slot] = i + 1;
        if (secs[i].type == SHT_NOTE && len >= 5 && memcmp(name, ".note", 5) == 0) {
            /* build_id = self._build_id(...); `if build_id: break`: the last value computed
             * stays, and an empty id ("") keeps looking */
            p->build_id_found = build_id(p, secs[i].offset, secs[i].size, &p->build_id_off, &p->build_id_len);
            if (p->build_id_found && p->build_id_len > 0)
                break;
        }
    }
    free(table);
    return OK;
}

/* _Parser._section_headers: emits every readable name, in header order */
static int section_headers(struct parser *p, wide shoff, unsigned shentsize, unsigned shnum, unsigned shstrndx)
{
    if (shoff == 0 || shnum == 0)
        return OK;
    if (shentsize < (p->is64 ? 64u : 40u) || shoff + (wide)shnum * shentsize > p->size || shstrndx >= shnum)
        return OK;  /* the loader never reads sections; neither do we when they are broken */
    struct section stack[64];
    struct section *secs = shnum <= 64 ? stack : malloc(shnum * sizeof *secs);
    if (!secs)
        return FALLBACK;
    wide str_off = 0, str_size = 0;
    for (unsigned i = 0; i < shnum; i++) {
        wide base = shoff + (wide)i * shentsize;
        secs[i].type = (uint32_t)get(p, base + 4, 4);
        secs[i].named = 0;
        if (p->is64) {
            secs[i].offset = get(p, base + 24, 8);
            secs[i].size = get(p, base + 32, 8);
            secs[i].entsize = get(p, base + 56, 8);
        } else {
            secs[i].offset = get(p, base + 16, 4);
            secs[i].size = get(p, base + 20, 4);
            secs[i].entsize = get(p, base + 36, 4);
        }
        if (i == shstrndx) {
            str_off = secs[i].offset;
            str_size = secs[i].size;
        }
    }
    int rc = OK;
    if (str_off + str_size <= p->size) {
        for (unsigned i = 0; i < shnum; i++) {
            wide name = get(p, shoff + (wide)i * shentsize, 4);
            size_t start, len;
            if (cstring(p, str_off + name, str_off + str_size, &start, &len) != OK)
                continue;  /* a bad name is skipped, not an error */
            secs[i].named = 1;
            if (!p->has_dynsym && len == 7 && memcmp(p->data + start, ".dynsym", 7) == 0) {
                p->has_dynsym = 1;
                p->dynsym_size = secs[i].size;
                p->dynsym_entsize = secs[i].entsize;
            }
            secs[i].name_pos = p->out->strings_len;
            secs[i].name_len = len;
            rc = emit(p, p->data + start, len, -1);
            if (rc != OK)
                break;
            p->out->n_sections++;
        }
        p->out->has_sections = p->out->n_sections > 0;
        if (rc == OK && !p->build_id_found)
            rc = section_build_id(p, secs, shnum);
    }
    if (secs != stack)
        free(secs);
    return rc;
}

/* the build id as lower-case hex, once */
static int emit_build_id(struct parser *p)
{
    if (!p->build_id_found)
        return OK;
    static const char digits[] = "0123456789abcdef";
    size_t len = (size_t)p->build_id_len;
    if (2 * len + 1 > p->cap - p->out->strings_len)
        return FALLBACK;
    char *dst = p->strings + p->out->strings_len;
    const unsigned char *src = p->data + (size_t)p->build_id_off;
    for (size_t i = 0; i < len; i++) {
        dst[2 * i] = digits[src[i] >> 4];
        dst[2 * i + 1] = digits[src[i] & 15];
    }
    dst[2 * len] = 0;
    p->out->strings_len += 2 * len + 1;
    p->out->has_build_id = 1;
    p->build_id_found = 0;
    return OK;
}

/* --- dynamic section ------------------------------------------------------------------ */

struct tags {
    int has_strtab, has_strsz, has_flags, has_flags_1, has_verneed, has_verneednum, has_verdef, has_verdefnum;
    uint64_t strtab, strsz, flags, flags_1, verneed, verneednum, verdef, verdefnum;
    int has_symtab, has_hash, has_gnu_hash, has_syment, has_versym;
    uint64_t symtab, hash, gnu_hash, syment, versym;
    int any_string_tag;
};

#define FIRST(field, value)          \
    if (!t->has_##field) {           \
        t->has_##field = 1;          \
        t->field = (value);          \
    }

static void note_tag(struct tags *t, int64_t tag, uint64_t value)
{
    switch (tag) {
    case DT_NEEDED:
    case DT_SONAME:
    case DT_RPATH:
    case DT_RUNPATH:
        t->any_string_tag = 1;
        break;
    case DT_STRTAB: FIRST(strtab, value) break;
    case DT_STRSZ: FIRST(strsz, value) break;
    case DT_FLAGS: FIRST(flags, value) break;
    case DT_FLAGS_1: FIRST(flags_1, value) break;
    case DT_VERNEED: FIRST(verneed, value) break;
    case DT_VERNEEDNUM: FIRST(verneednum, value) break;
    case DT_VERDEF: FIRST(verdef, value) break;
    case DT_VERDEFNUM: FIRST(verdefnum, value) break;
    case DT_SYMTAB: FIRST(symtab, value) break;
    case DT_HASH: FIRST(hash, value) break;
    case DT_GNU_HASH: FIRST(gnu_hash, value) break;
    case DT_SYMENT: FIRST(syment, value) break;
    case DT_VERSYM: FIRST(versym, value) break;
    default: break;
    }
}

static void dyn_at(const struct parser *p, wide offset, int64_t *tag, uint64_t *value)
{
    if (p->is64) {
        *tag = (int64_t)get(p, offset, 8);
        *value = get(p, offset + 8, 8);
    } else {
        *tag = (int32_t)(uint32_t)get(p, offset, 4);
        *value = get(p, offset + 4, 4);
    }
}

/* version_names[index] = name, kept only when symbols are read */
static int set_version_name(struct parser *p, unsigned index, size_t start, size_t len)
{
    if (!p->want_symbols)
        return OK;
    if (index >= p->n_version_names) {
        size_t grown = (index | 63) + 1;
        struct version_name *bigger = realloc(p->version_names, grown * sizeof *bigger);
        if (!bigger)
            return FALLBACK;
        memset(bigger + p->n_version_names, 0, (grown - p->n_version_names) * sizeof *bigger);
        p->version_names = bigger;
        p->n_version_names = grown;
    }
    p->version_names[index] = (struct version_name){1, start, len};
    return OK;
}

/* _Parser._verneed */
static int verneed(struct parser *p, wide offset, uint64_t count, wide strtab, wide strend)
{
    uint64_t limit = count < MAX_VER_ENTRIES ? count : MAX_VER_ENTRIES;
    for (uint64_t seen = 0; count && seen < limit;) {
        seen++;
        TRY(need(p, offset, 16));
        unsigned cnt = (unsigned)get(p, offset + 2, 2);
        wide file_off = get(p, offset + 4, 4), aux = get(p, offset + 8, 4), next = get(p, offset + 12, 4);
        wide aux_off = offset + aux;
        unsigned versions = 0;
        for (unsigned k = 0; k < cnt && k < MAX_VER_ENTRIES; k++) {
            TRY(need(p, aux_off, 16));
            unsigned flags = (unsigned)get(p, aux_off + 4, 2);
            wide name_off = get(p, aux_off + 8, 4), aux_next = get(p, aux_off + 12, 4);
            unsigned other = (unsigned)get(p, aux_off + 6, 2);
            size_t start, len;
            TRY(cstring(p, strtab + name_off, strend, &start, &len));
            TRY(emit(p, p->data + start, len, flags & VER_FLG_WEAK ? '1' : '0'));
            TRY(set_version_name(p, other & 0x7FFF, start, len));
            versions++;
            if (aux_next == 0)
                break;
            aux_off += aux_next;
        }
        TRY(emit_cstring(p, strtab + file_off, strend, -1));
        if (p->out->n_verneed >= p->vn_cap)
            return FALLBACK;
        p->vn_counts[p->out->n_verneed++] = versions;
        if (next == 0)
            break;
        offset += next;
    }
    return OK;
}

/* _Parser._verdef */
static int verdef(struct parser *p, wide offset, uint64_t count, wide strtab, wide strend)
{
    uint64_t limit = count < MAX_VER_ENTRIES ? count : MAX_VER_ENTRIES;
    for (uint64_t seen = 0; count && seen < limit;) {
        seen++;
        TRY(need(p, offset, 20));
        unsigned flags = (unsigned)get(p, offset + 2, 2), ndx = (unsigned)get(p, offset + 4, 2),
                 cnt = (unsigned)get(p, offset + 6, 2);
        wide aux = get(p, offset + 12, 4), next = get(p, offset + 16, 4);
        if (cnt) {
            TRY(need(p, offset + aux, 8));
            wide name_off = get(p, offset + aux, 4);
            size_t start, len;
            TRY(cstring(p, strtab + name_off, strend, &start, &len));
            TRY(set_version_name(p, ndx & 0x7FFF, start, len));
            if (!(flags & VER_FLG_BASE)) {
                TRY(emit(p, p->data + start, len, -1));
                p->out->n_verdef++;
            }
        }
        if (next == 0)
            break;
        offset += next;
    }
    return OK;
}

/* --- dynamic symbols ------------------------------------------------------------------ */

/* _Parser._gnu_hash_count: the highest index reachable through the buckets' chains + 1 */
static int gnu_hash_count(struct parser *p, wide offset, wide *count)
{
    TRY(need(p, offset, 16));
    wide nbuckets = get(p, offset, 4), symoffset = get(p, offset + 4, 4), bloom_size = get(p, offset + 8, 4);
    wide buckets = offset + 16 + bloom_size * (p->is64 ? 8 : 4);
    wide chains = buckets + nbuckets * 4;
    if (buckets + nbuckets * 4 > p->size)
        return fail(p, "DT_GNU_HASH buckets past end of file");
    wide last = 0;
    for (wide i = 0; i < nbuckets; i++) {
        wide value = get(p, buckets + 4 * i, 4);
        if (value > last)
            last = value;
    }
    if (last < symoffset) {
        *count = symoffset;
        return OK;
    }
    for (wide index = last;;) {
        wide at = chains + 4 * (index - symoffset);
        TRY(need(p, at, 4));
        if (get(p, at, 4) & 1) {
            *count = index + 1;
            return OK;
        }
        index++;
        if (index - last > p->size / 4)
            return fail(p, "DT_GNU_HASH chain does not terminate");
    }
}

/* _Parser._symbol_count */
static int symbol_count(struct parser *p, const struct tags *t, wide *count)
{
    *count = 0;
    if (p->has_dynsym && p->dynsym_entsize) {
        *count = p->dynsym_size / p->dynsym_entsize;
        return OK;
    }
    wide at;
    if (t->has_hash) {
        TRY(vaddr_to_offset(p, t->hash, &at));
        TRY(need(p, at, 8));
        *count = get(p, at + 4, 4);
        return OK;
    }
    if (t->has_gnu_hash) {
        TRY(vaddr_to_offset(p, t->gnu_hash, &at));
        return gnu_hash_count(p, at, count);
    }
    return OK;
}

/* grow one of the symbol output buffers to hold `more` bytes past `used` */
static int reserve(char **buffer, size_t *cap, size_t used, size_t more)
{
    if (more > MAX_SYMBOL_OUTPUT - used)
        return FALLBACK;
    if (used + more <= *cap)
        return OK;
    size_t grown = *cap ? *cap : 4096;
    while (grown < used + more)
        grown *= 2;
    char *bigger = realloc(*buffer, grown);
    if (!bigger)
        return FALLBACK;
    *buffer = bigger;
    *cap = grown;
    return OK;
}

static int wanted(const struct parser *p, wide name_start, wide strend)
{
    if (p->want_symbols != SD_FASTELF_PREFIXED_SYMBOLS && p->want_symbols != SD_FASTELF_EXPORTED_PREFIXED)
        return 1;
    /* reader.py keeps the names whose string-table offset is where one of the prefixes
     * occurs, whole, inside [strtab, strend).  Most names fail on their first byte: the
     * table of first bytes saves a memcmp per prefix per symbol (2.5 million over /usr/lib). */
    if (name_start < strend && !p->prefix_first[p->data[(size_t)name_start]])
        return 0;
    const char *prefix = p->prefix_bytes;
    for (size_t k = 0; k < p->n_prefixes; prefix += p->prefix_lens[k], k++) {
        size_t len = p->prefix_lens[k];
        if (name_start + (wide)len <= strend && memcmp(p->data + (size_t)name_start, prefix, len) == 0)
            return 1;
    }
    return 0;
}

/* _Parser._symbols */
static int symbols(struct parser *p, const struct tags *t, wide strtab, wide strend)
{
    struct sd_fastelf_symbols *syms = p->syms;
    wide count;
    TRY(symbol_count(p, t, &count));
    if (count <= 0)
        return OK;
    wide symtab;
    TRY(vaddr_to_offset(p, t->symtab, &symtab));
    int sym_size = p->is64 ? 24 : 16;
    wide entsize = t->has_syment ? (wide)t->syment : sym_size;
    if (entsize == 0)
        entsize = sym_size;
    char a[48];
    if (entsize < sym_size)
        return fail(p, "DT_SYMENT %llu too small", (unsigned long long)entsize);
    if (symtab + count * entsize > p->size) {
        /* a truncated table: read what is there (Python's floor division) */
        wide room = p->size - symtab;
        count = room >= 0 ? room / entsize : -((-room + entsize - 1) / entsize);
    }
    int has_versym = 0;
    wide versym = 0;
    if (t->has_versym) {
        TRY(vaddr_to_offset(p, t->versym, &versym));
        has_versym = versym + 2 * count <= p->size;
    }
    if (has_versym && p->n_version_names) {
        p->version_slots = calloc(p->n_version_names, sizeof *p->version_slots);
        if (!p->version_slots)
            return FALLBACK;
    }
    for (wide index = 1; index < count; index++) {
        wide at = symtab + index * entsize;
        wide name_off = get(p, at, 4);
        unsigned info, shndx;
        if (p->is64) {
            info = (unsigned)get(p, at + 4, 1);
            shndx = (unsigned)get(p, at + 6, 2);
        } else {
            info = (unsigned)get(p, at + 12, 1);
            shndx = (unsigned)get(p, at + 14, 2);
        }
        wide name_start = strtab + name_off;
        if (!wanted(p, name_start, strend))
            continue;
        unsigned bind = info >> 4;
        if (bind == STB_LOCAL)
            continue;
        unsigned slot = 0, hidden = 0;
        if (has_versym) {
            unsigned ver = (unsigned)get(p, versym + 2 * index, 2);
            hidden = (ver & 0x8000) != 0;
            unsigned vindex = ver & 0x7FFF;
            if (vindex > 1 && vindex < p->n_version_names && p->version_names[vindex].set) {
                if (!p->version_slots[vindex]) {
                    const struct version_name *v = &p->version_names[vindex];
                    TRY(reserve(&syms->versions, &syms->versions_cap, syms->versions_len, v->len + 1));
                    memcpy(syms->versions + syms->versions_len, p->data + v->start, v->len);
                    syms->versions[syms->versions_len + v->len] = 0;
                    syms->versions_len += v->len + 1;
                    p->version_slots[vindex] = ++syms->n_versions;
                }
                slot = p->version_slots[vindex];
            }
        }
        const unsigned char *nul = name_start < strend ?
            memchr(p->data + (size_t)name_start, 0, (size_t)(strend - name_start)) : NULL;
        if (!nul)
            return fail(p, "symbol name at %s outside or unterminated in DT_STRTAB", hex(a, name_off));
        size_t len = (size_t)(nul - (p->data + (size_t)name_start));
        /* the exported ones only: read and checked as the others (the same errors), not kept */
        if (p->want_symbols == SD_FASTELF_EXPORTED_PREFIXED && (shndx == SHN_UNDEF || hidden))
            continue;
        TRY(reserve(&syms->names, &syms->names_cap, syms->names_len, len + 1));
        memcpy(syms->names + syms->names_len, p->data + (size_t)name_start, len + 1);
        syms->names_len += len + 1;
        TRY(reserve((char **)&syms->records, &syms->records_cap, syms->count * 8, 8));
        unsigned char *record = syms->records + syms->count * 8;
        record[0] = (unsigned char)bind;
        record[1] = (unsigned char)(info & 0xF);
        record[2] = shndx != SHN_UNDEF;
        record[3] = (unsigned char)hidden;
        uint32_t slot32 = slot;
        memcpy(record + 4, &slot32, 4);
        syms->count++;
    }
    return OK;
}

static int dynamic(struct parser *p, wide offset, wide filesz)
{
    int dsz = p->is64 ? 16 : 8;
    wide count = filesz / dsz;  /* filesz >= 0: floor division as in Python */
    if (count > MAX_DYN_ENTRIES)
        count = MAX_DYN_ENTRIES;
    if (offset + count * dsz > p->size)
        return fail(p, "PT_DYNAMIC past end of file");
    struct tags t;
    memset(&t, 0, sizeof t);
    wide entries = 0;
    for (; entries < count; entries++) {
        int64_t tag;
        uint64_t value;
        dyn_at(p, offset + entries * dsz, &tag, &value);
        if (tag == DT_NULL)
            break;
        note_tag(&t, tag, value);
    }
    if (!t.has_strtab) {
        if (t.any_string_tag)
            return fail(p, "DT_STRTAB missing");
        return OK;
    }
    wide strtab;
    TRY(vaddr_to_offset(p, t.strtab, &strtab));
    wide strsz = t.has_strsz ? (wide)t.strsz : p->size - strtab;
    if (strtab + strsz > p->size)
        return fail(p, "DT_STRSZ past end of file");
    wide strend = strtab + strsz;

    struct sd_fastelf_result *out = p->out;
    /* NEEDED in order; the first SONAME, RPATH and RUNPATH, each read where it stands so a
     * bad string fails in the same order as in reader.py.  Their output places differ
     * (needed first), so SONAME/RPATH/RUNPATH are located here and emitted after. */
    size_t soname[2] = {0, 0}, rpath[2] = {0, 0}, runpath[2] = {0, 0};
    for (wide i = 0; i < entries; i++) {
        int64_t tag;
        uint64_t value;
        dyn_at(p, offset + i * dsz, &tag, &value);
        if (tag == DT_NEEDED) {
            TRY(emit_cstring(p, strtab + (wide)value, strend, -1));
            out->n_needed++;
        } else if (tag == DT_SONAME && !out->has_soname) {
            TRY(cstring(p, strtab + (wide)value, strend, &soname[0], &soname[1]));
            out->has_soname = 1;
        } else if (tag == DT_RPATH && !out->has_rpath) {
            TRY(cstring(p, strtab + (wide)value, strend, &rpath[0], &rpath[1]));
            out->has_rpath = 1;
        } else if (tag == DT_RUNPATH && !out->has_runpath) {
            TRY(cstring(p, strtab + (wide)value, strend, &runpath[0], &runpath[1]));
            out->has_runpath = 1;
        }
    }
    if (out->has_soname)
        TRY(emit(p, p->data + soname[0], soname[1], -1));
    if (out->has_rpath)
        TRY(emit(p, p->data + rpath[0], rpath[1], -1));
    if (out->has_runpath)
        TRY(emit(p, p->data + runpath[0], runpath[1], -1));
    out->flags = t.has_flags ? t.flags : 0;
    out->flags_1 = t.has_flags_1 ? t.flags_1 : 0;
    /* the build id sits between the dynamic strings and the versions in the output */
    TRY(emit_build_id(p));
    if (t.has_verneed) {
        wide at;
        TRY(vaddr_to_offset(p, t.verneed, &at));
        TRY(verneed(p, at, t.has_verneednum ? t.verneednum : 0, strtab, strend));
    }
    if (t.has_verdef) {
        wide at;
        TRY(vaddr_to_offset(p, t.verdef, &at));
        TRY(verdef(p, at, t.has_verdefnum ? t.verdefnum : 0, strtab, strend));
    }
    if (p->want_symbols && t.has_symtab)
        TRY(symbols(p, &t, strtab, strend));
    return OK;
}

/* --- header --------------------------------------------------------------------------- */

static int parse(struct parser *p)
{
    struct sd_fastelf_result *out = p->out;
    const unsigned char *ident = p->data;
    if (memcmp(ident, "\x7f" "ELF", 4) != 0) {
        snprintf(out->error, sizeof out->error, "not an ELF file");
        return ERR;
    }
    int ei_class = ident[4], ei_data = ident[5];
    if (ei_class != 1 && ei_class != 2)
        return fail(p, "bad EI_CLASS %d", ei_class);
    if (ei_data != 1 && ei_data != 2)
        return fail(p, "bad EI_DATA %d", ei_data);
    p->is64 = ei_class == 2;
    p->le = ei_data == 1;
    TRY(need(p, 16, p->is64 ? 48 : 36));
    out->elf_class = p->is64 ? 64 : 32;
    out->little_endian = p->le;
    out->osabi = ident[7];
    out->e_type = (int)get(p, 16, 2);
    out->machine = (int)get(p, 18, 2);
    wide phoff, shoff;
    unsigned phentsize, phnum, shentsize, shnum, shstrndx;
    if (p->is64) {
        phoff = get(p, 32, 8);
        shoff = get(p, 40, 8);
        phentsize = (unsigned)get(p, 54, 2);
        phnum = (unsigned)get(p, 56, 2);
        shentsize = (unsigned)get(p, 58, 2);
        shnum = (unsigned)get(p, 60, 2);
        shstrndx = (unsigned)get(p, 62, 2);
    } else {
        phoff = get(p, 28, 4);
        shoff = get(p, 32, 4);
        phentsize = (unsigned)get(p, 42, 2);
        phnum = (unsigned)get(p, 44, 2);
        shentsize = (unsigned)get(p, 46, 2);
        shnum = (unsigned)get(p, 48, 2);
        shstrndx = (unsigned)get(p, 50, 2);
    }
    TRY(program_headers(p, phoff, phentsize, phnum));

    /* reader.py reads the section headers before walking the segments; that step can not
     * fail, so it runs after the walk here, where its build-id fallback is decided */
    int have_dynamic = 0;
    wide dyn_offset = 0, dyn_filesz = 0;
    struct segment seg;
    for (unsigned i = 0; i < p->phnum; i++) {
        segment_at(p, i, &seg);
        if (seg.type == PT_INTERP) {
            size_t start, len;
            TRY(cstring(p, seg.offset, seg.offset + seg.filesz, &start, &len));
            /* the last PT_INTERP wins; only it is emitted (first in the output) */
            out->has_interp = 1;
            out->strings_len = 0;
            TRY(emit(p, p->data + start, len, -1));
        } else if (seg.type == PT_DYNAMIC) {
            have_dynamic = 1;
            dyn_offset = seg.offset;
            dyn_filesz = seg.filesz;
        } else if (seg.type == PT_NOTE && !p->build_id_found) {
            wide off, len;
            if (build_id(p, seg.offset, seg.filesz, &off, &len)) {
                p->build_id_found = 1;
                p->build_id_off = off;
                p->build_id_len = len;
            }
        }
    }
    TRY(section_headers(p, shoff, shentsize, shnum, shstrndx));
    /* an empty PT_DYNAMIC (separate debug files) is "no dynamic section" to ld.so */
    out->has_dynamic = have_dynamic && dyn_filesz > 0;
    if (have_dynamic)
        TRY(dynamic(p, dyn_offset, dyn_filesz));
    TRY(emit_build_id(p));  /* when dynamic() did not place it */
    return OK;
}

/* --- x86 ISA level ---------------------------------------------------------------------- */

/* properties.py _isa_from_notes: NT_GNU_PROPERTY_TYPE_0 "GNU" notes in [base, base + len)
 * of the image, properties padded to 8 (read with get(): the caller checked little-endian) */
static unsigned int isa_from_notes(const struct parser *p, uint64_t base, uint64_t len)
{
    unsigned int needed = 0;
    uint64_t at = 0;
    while (at + 12 <= len) {
        uint64_t namesz = get(p, base + at, 4), descsz = get(p, base + at + 4, 4);
        uint32_t n_type = (uint32_t)get(p, base + at + 8, 4);
        uint64_t name_at = at + 12;
        uint64_t desc_at = name_at + ((namesz + 3) & ~(uint64_t)3);
        uint64_t end = desc_at + ((descsz + 7) & ~(uint64_t)7);
        if (desc_at + descsz > len)
            break;
        if (n_type == NT_GNU_PROPERTY_TYPE_0 && namesz == 4 && memcmp(p->data + base + name_at, "GNU", 4) == 0) {
            uint64_t ptr = desc_at, stop = desc_at + descsz;
            while (ptr + 8 <= stop) {
                uint32_t pr_type = (uint32_t)get(p, base + ptr, 4);
                uint64_t pr_datasz = get(p, base + ptr + 4, 4);
                if (ptr + 8 + pr_datasz > stop)
                    break;
                if (pr_type == GNU_PROPERTY_X86_ISA_1_NEEDED && pr_datasz == 4)
                    needed |= (unsigned int)get(p, base + ptr + 8, 4);
                ptr += 8 + ((pr_datasz + 7) & ~(uint64_t)7);
            }
        }
        if (end <= at)
            break;
        at = end;
    }
    return needed;
}

/* properties.py x86_isa_needed, over the image already read: GNU_PROPERTY_X86_ISA_1_NEEDED
 * of the first PT_GNU_PROPERTY of a 64-bit little-endian x86-64 object, else 0.  The same
 * bounds: a header under 64 bytes, e_phentsize under 56, e_phnum 0 or past 4096, a segment
 * empty or over 64 KiB give 0; a table or segment cut by the end of the file is read as far
 * as it goes (a short pread), and one that starts past it is empty (an offset past 2^63,
 * os.pread's OverflowError there, is past any file too). */
static unsigned int x86_isa_needed(const struct parser *p)
{
    uint64_t size = (uint64_t)p->size;
    if (size < 64 || memcmp(p->data, "\x7f" "ELF", 4) != 0 || p->data[4] != 2 || p->data[5] != 1)
        return 0;
    if (get(p, 18, 2) != EM_X86_64)
        return 0;
    uint64_t phoff = get(p, 32, 8);
    unsigned phentsize = (unsigned)get(p, 54, 2), phnum = (unsigned)get(p, 56, 2);
    if (phentsize < 56 || phnum == 0 || phnum > 4096)
        return 0;
    uint64_t table = phoff < size ? size - phoff : 0;
    if (table > (uint64_t)phentsize * phnum)
        table = (uint64_t)phentsize * phnum;
    for (uint64_t i = 0; i < table / phentsize; i++) {
        uint64_t ph = phoff + i * phentsize;
        uint64_t p_offset = get(p, ph + 8, 8), p_filesz = get(p, ph + 32, 8);
        if (get(p, ph, 4) == PT_GNU_PROPERTY && p_filesz > 0 && p_filesz <= MAX_PROPERTY_SEGMENT) {
            uint64_t len = p_offset < size ? size - p_offset : 0;
            if (len > p_filesz)
                len = p_filesz;
            return isa_from_notes(p, p_offset < size ? p_offset : 0, len);
        }
    }
    return 0;
}

int sd_fastelf_abi(void)
{
    return SD_FASTELF_ABI;
}

void sd_fastelf_free_symbols(struct sd_fastelf_symbols *symbols)
{
    free(symbols->names);
    free(symbols->records);
    free(symbols->versions);
    memset(symbols, 0, sizeof *symbols);
}

int sd_fastelf_read(const char *path, struct sd_fastelf_result *out, char *strings, size_t strings_cap,
                    unsigned int *vn_counts, size_t vn_counts_cap, int want_symbols, const char *prefix_bytes,
                    const size_t *prefix_lens, size_t n_prefixes, struct sd_fastelf_symbols *symbols,
                    unsigned char *scratch, size_t scratch_cap)
{
    memset(out, 0, sizeof *out);
    if (symbols)
        memset(symbols, 0, sizeof *symbols);
    if (want_symbols && !symbols)
        return FALLBACK;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer (reader.py does the same) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        /* reader.py: f"{path}: {exc.strerror.lower()}" */
        int i = snprintf(out->error, sizeof out->error, "%s", strerror(errno));
        for (int k = 0; k < i && k < (int)sizeof out->error; k++)
            if (out->error[k] >= 'A' && out->error[k] <= 'Z')
                out->error[k] = (char)(out->error[k] - 'A' + 'a');
        return ERR;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return FALLBACK;  /* an OSError in reader.py, not an ELFError */
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        snprintf(out->error, sizeof out->error, "not a regular file");
        return ERR;
    }
    if (st.st_size < 16) {
        close(fd);
        snprintf(out->error, sizeof out->error, "not an ELF file (too short)");
        return ERR;
    }
    /* Most libraries are small (569 of /usr/lib's 902 are under 64 KB): one pread into the
     * caller's scratch buffer costs less than mmap, the page faults and munmap (two system
     * calls and a fault per page touched, against one copy).  A short read (the file changed under us)
     * takes the mapping path, which sees what reader.py's mmap would.  (A small regular
     * file that cannot be mapped at all, as on sysfs, is read here where reader.py says
     * "cannot map file": both reject it, with different words, and it is never an ELF.) */
    void *map = NULL;
    int map_errno = 0;
    if (scratch && (size_t)st.st_size <= scratch_cap && pread(fd, scratch, (size_t)st.st_size, 0) == st.st_size)
        map = scratch;
    else {
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        map_errno = errno;
    }
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(out->error, sizeof out->error, "cannot map file: [Errno %d] %s", map_errno, strerror(map_errno));
        return ERR;
    }
    struct parser p;
    memset(&p, 0, sizeof p);
    p.data = map;
    p.size = st.st_size;
    p.out = out;
    p.strings = strings;
    p.cap = strings_cap;
    p.vn_counts = vn_counts;
    p.vn_cap = vn_counts_cap;
    p.want_symbols = want_symbols;
    p.prefix_bytes = prefix_bytes;
    p.prefix_lens = prefix_lens;
    p.n_prefixes = prefix_bytes && prefix_lens ? n_prefixes : 0;
    for (size_t k = 0, at = 0; k < p.n_prefixes; at += prefix_lens[k], k++) {
        if (prefix_lens[k] == 0)
            memset(p.prefix_first, 1, sizeof p.prefix_first);
        else
            p.prefix_first[(unsigned char)prefix_bytes[at]] = 1;
    }
    p.syms = symbols;
    int rc = parse(&p);
    if (rc == OK)
        out->x86_isa_needed = x86_isa_needed(&p);
    free(p.version_names);
    free(p.version_slots);
    if (map != scratch)
        munmap(map, (size_t)st.st_size);
    return rc;
}
