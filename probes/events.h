/* The one event record every probe emits, and the constants that tag it.
 *
 * This header is the single definition: the BPF programs include it, and
 * seedance.probes.layout parses the struct and the #defines below to build the
 * matching ctypes structure, so the two sides cannot drift.  Keep it to plain
 * "type name;" / "type name[LEN];" fields and "#define SD_* <int>" lines.
 */
#ifndef SEEDANCE_EVENTS_H
#define SEEDANCE_EVENTS_H

#define SD_COMM_LEN 16
#define SD_PATH_LEN 256
#define SD_TEXT_LEN 256

/* event types */
#define SD_EV_EXEC 1          /* path: new image; aux: old pid; bytes: allocations the old image held */
#define SD_EV_EXIT 2          /* the last thread of a process exited; bytes: allocations it held */
#define SD_EV_DLOPEN 3        /* dlopen/dlmopen entry: path, flags, ns (lmid) */
#define SD_EV_DLOPEN_RET 4    /* return: handle in ptr (0 = NULL), text: link_map l_name */
#define SD_EV_LOADER_ERROR 5  /* path: object the loader blames, text: its message */
#define SD_EV_OBJECT 6        /* new link-map entry: path, ptr: link_map, base: l_addr, ns */
#define SD_EV_CUDA_ALLOC 7    /* ptr, bytes, device, caller, api */
#define SD_EV_CUDA_FREE 8     /* ptr, device, caller, api */

/* which entry point produced a DLOPEN / CUDA event (api field) */
#define SD_API_DLOPEN 1
#define SD_API_DLMOPEN 2
#define SD_API_CU_MEM_ALLOC 10
#define SD_API_CU_MEM_ALLOC_ASYNC 11
#define SD_API_CU_MEM_ALLOC_MANAGED 12
#define SD_API_CU_MEM_ALLOC_FROM_POOL_ASYNC 13
#define SD_API_CU_MEM_FREE 20
#define SD_API_CU_MEM_FREE_ASYNC 21
#define SD_API_CUDA_MALLOC 30
#define SD_API_CUDA_MALLOC_MANAGED 31
#define SD_API_CUDA_MALLOC_ASYNC 32
#define SD_API_CUDA_FREE 40
#define SD_API_CUDA_FREE_ASYNC 41

/* what the thread was doing when the loader raised an error (context field) */
#define SD_CTX_STARTUP 0      /* program start-up or lazy binding: fatal */
#define SD_CTX_DLOPEN 1       /* inside dlopen/dlmopen: that dlopen returns NULL */
#define SD_CTX_DLSYM 2        /* inside dlsym/dlvsym: a lookup the caller may expect to miss */

/* flags field */
#define SD_FLAG_STOPPED 1     /* the probe sent SIGSTOP so probes can attach first */

#define SD_DEVICE_UNKNOWN -1

struct sd_event {
	u64 ts_ns;
	u32 type;
	u32 pid;
	u32 tid;
	u32 api;
	u32 context;
	u32 flags;
	s32 device;
	u32 aux;
	s64 ret;
	s64 ns;
	u64 ptr;
	u64 bytes;
	u64 base;
	u64 caller;
	char comm[SD_COMM_LEN];
	char path[SD_PATH_LEN];
	char text[SD_TEXT_LEN];
};

#endif
