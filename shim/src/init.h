/* init.h: start-up (init.c), once, on the first CUDA call or from the audit interface. */
#ifndef SD_INIT_H
#define SD_INIT_H

#include "common.h"

SD_HIDDEN void sd_init(void);

#endif
