/* impl.h: one implementation per hook, in the file of its area (memory.c, device.c,
 * launch.c; hooks.c for cuGetProcAddress), called by the exported wrapper of hooks.c;
 * `caller` is the return address of the application's call, for the calling-library
 * attribution. */
#ifndef SD_IMPL_H
#define SD_IMPL_H

#include "common.h"

#define HOOK(ret, name, proc, since, flags, noreal, params, args) \
    SD_HIDDEN ret sd_impl_##name(void *caller, SD_UNPAREN params);
#include "hooks.def"

#endif
