/* common.h: what every C file of the shim shares: the CUDA types it sees (cuda_abi.h), the
 * registry layout Python reads too (seedance_shim.h), and the hooks' numbers and prototypes
 * from hooks.def.  Declares no function of any area: each area has its own header, and an
 * area uses only the areas below it (tests/unit/test_house_rules.py checks that the files
 * neither include nor call each other in a circle):
 *
 *     config.c    the configuration and the start-up state       (uses nothing)
 *     real.c      the hooks' table, the real functions            (uses nothing)
 *     registry.c  slots, groups, events and notes, records        -> config, real
 *     device.c    affinity                                        -> config, real, registry
 *     memory.c, launch.c  the hooks of their area (impl.h)        -> device, real, registry
 *     init.c      start-up, fork, exit                            -> config, registry
 *     hooks.c     the exported wrappers and cuGetProcAddress      -> every area above
 *     dlsym.c, audit.c    entered from outside only               -> hooks, real / init, registry
 *
 * Not installed; Python never sees it. */
#ifndef SD_COMMON_H
#define SD_COMMON_H

#include "cuda_abi.h"
#include "../include/seedance_shim.h"

#define SD_EXPORT __attribute__((visibility("default")))
#define SD_HIDDEN __attribute__((visibility("hidden")))
#define SD_LIKELY(x) __builtin_expect(!!(x), 1)
#define SD_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define SD_UNPAREN(...) __VA_ARGS__

#define SD_LIB_UNKNOWN 0xFFFFu
#define SD_HF_PTSZ 1
#define SD_HF_RUNTIME 2

#ifndef SD_VERSION_STRING
#define SD_VERSION_STRING "0.1.0"
#endif

enum sd_hook_id {
#define HOOK(ret, name, proc, since, flags, noreal, params, args) SD_HOOK_##name,
#define DRIVER(name, proc, since) SD_HOOK_##name,
#include "hooks.def"
    SD_HOOK_COUNT
};
_Static_assert(SD_HOOK_COUNT <= SD_MAX_APIS, "raise SD_MAX_APIS (and SD_ABI_VERSION)");

/* The exported wrappers (hooks.c), declared for the type of each real function (SD_REAL);
 * with SD_CHECK_WITH_CUDA_H these redeclarations are checked against cuda.h's own prototypes. */
#define HOOK(ret, name, proc, since, flags, noreal, params, args) SD_EXPORT ret name params;
#include "hooks.def"

#endif
