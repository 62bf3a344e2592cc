/* device.h: device affinity (device.c): which devices the process sees, and as which. */
#ifndef SD_DEVICE_H
#define SD_DEVICE_H

#include "real.h"

SD_HIDDEN void sd_device_resolve(void);
SD_HIDDEN int sd_device_visible(CUdevice dev);
SD_HIDDEN int sd_logical_to_physical(int ordinal);
/* on every allocation: inline, so the hot path makes no call */
static inline int sd_current_device(void)
{
    CUresult (*get)(CUdevice *) = (CUresult(*)(CUdevice *))sd_real(SD_HOOK_cuCtxGetDevice);
    CUdevice dev;
    if (!get || get(&dev) != CUDA_SUCCESS || dev < 0 || dev >= SD_MAX_DEVICES)
        return -1;
    return dev;
}

#endif
