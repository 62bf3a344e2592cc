/*
 * audit.c: the LD_AUDIT side of the same library (`seedance run --audit`).
 *
 * ld.so loads an audit module into its own link-map namespace, before the program's
 * libraries, so this copy has its own globals; it joins the process's registry slot
 * (same pid and start time) and writes to the same event ring:
 *   la_objsearch -> SD_EV_OBJSEARCH: every path tried, with the search source
 *                   (LA_SER_ORIG, _LIBPATH, _RUNPATH, _CONFIG, _DEFAULT, _SECURE)
 *   la_objopen   -> SD_EV_OBJOPEN: every object loaded, numbered (the cookie)
 *   la_symbind64 -> SD_EV_SYMBIND: bindings of CUDA symbols (cuXxx, cuda*, cublas*,
 *                   cudnn*, cufft*, curand*, cusparse*, cusolver*, nvrtc*, nccl*)
 * This shows, without root, which libraries a process really loaded and from where.
 */
#define _GNU_SOURCE
#include <link.h>
#include <string.h>

#include "config.h"
#include "init.h"
#include "registry.h"

static uint32_t sd_local_objs;

SD_EXPORT unsigned int la_version(unsigned int version)
{
    sd_is_audit = 1;
    sd_init();
    return version < LAV_CURRENT ? version : LAV_CURRENT;
}

SD_EXPORT char *la_objsearch(const char *name, uintptr_t *cookie, unsigned int flag)
{
    sd_audit_event(SD_EV_OBJSEARCH, cookie ? (uint32_t)*cookie : 0, 0, flag, name);
    return (char *)name;
}

SD_EXPORT unsigned int la_objopen(struct link_map *map, Lmid_t lmid, uintptr_t *cookie)
{
    uint32_t n = sd_slot ? __atomic_add_fetch(&sd_slot->nobjs, 1, __ATOMIC_RELAXED)
                         : __atomic_add_fetch(&sd_local_objs, 1, __ATOMIC_RELAXED);
    *cookie = n;
    sd_audit_event(SD_EV_OBJOPEN, n, 0, (uint32_t)lmid, map && map->l_name ? map->l_name : "");
    return LA_FLG_BINDTO | LA_FLG_BINDFROM;
}

/* the CUDA driver (cuXxx), runtime (cudaXxx) and the CUDA libraries; not LAPACK's cungqr_ */
static int is_cuda_symbol(const char *name)
{
    static const char *prefixes[] = {"cuda", "cublas", "cudnn", "cufft", "curand", "cusparse", "cusolver",
                                     "nvrtc", "nccl"};
    if (name[0] == 'c' && name[1] == 'u' && name[2] >= 'A' && name[2] <= 'Z')
        return 1;
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0)
            return 1;
    return 0;
}

SD_EXPORT uintptr_t la_symbind64(Elf64_Sym *sym, unsigned int ndx, uintptr_t *refcook, uintptr_t *defcook,
                                 unsigned int *flags, const char *symname)
{
    (void)ndx;
    (void)flags;
    if (symname && is_cuda_symbol(symname))
        sd_audit_event(SD_EV_SYMBIND, refcook ? (uint32_t)*refcook : 0, defcook ? (uint32_t)*defcook : 0, 0,
                       symname);
    return sym->st_value;
}
