/* hooks.h: the exported wrappers by hook number (hooks.c), for the ways a program asks for
 * one by name: dlsym (dlsym.c) and cuGetProcAddress (hooks.c). */
#ifndef SD_HOOKS_H
#define SD_HOOKS_H

#include "common.h"

SD_HIDDEN extern void *const sd_wrappers[SD_HOOK_COUNT]; /* NULL for DRIVER entries */

#endif
