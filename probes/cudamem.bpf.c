/* CUDA device memory: allocations and frees, in the driver (libcuda.so.1) and in the
 * runtime (libcudart.so.*).  The loader attaches these per inode as the libraries
 * appear, so wheel, conda and toolkit copies are each probed once.
 *
 * Every allocator has the driver's shape "CUresult f(CUdeviceptr *dptr, size_t bytes, ...)"
 * (cudaMalloc: "cudaError_t f(void **ptr, size_t size)"): the pointer is read through
 * dptr on return, only when the call returned 0 (CUDA_SUCCESS / cudaSuccess).
 *
 * The runtime allocates through the driver.  A driver call made inside a runtime call on
 * the same thread is not reported, so each allocation is counted once, at the API the
 * program called.
 *
 * What is still allocated is kept in the kernel, in live_allocs (pid, pointer -> bytes,
 * device, caller, api): the hot path is a map update, the accounting survives a full ring
 * buffer, and at exit Python reads what the process still held.  Per-call events go to
 * the ring buffer only when streamed (SD_CUDA_EVENTS=1), without waking the reader.
 *
 * Device: a driver allocation lands on the device of the thread's current context
 * (cuCtxCreate/cuDevicePrimaryCtxRetain tell which device a context belongs to,
 * cuCtxSetCurrent/cuCtxPushCurrent which context is current); a runtime allocation on
 * the thread's cudaSetDevice device, 0 until set (the runtime's documented default).
 */
#include "common.bpf.h"

struct sd_alloc_call {
	u64 out;     /* CUdeviceptr* / void** */
	u64 bytes;
	u64 caller;
	u32 api;
	s32 device;
};

BPF_TABLE("lru_hash", u32, struct sd_alloc_call, alloc_inflight, 16384);
BPF_TABLE("lru_hash", u32, u32, runtime_depth, 16384);
BPF_TABLE("lru_hash", u64, s32, ctx_device, 16384);
BPF_TABLE("lru_hash", u32, u64, thread_ctx, 16384);
BPF_TABLE("lru_hash", u32, s32, thread_rt_device, 16384);
BPF_TABLE("lru_hash", u32, struct sd_alloc_call, ctx_inflight, 16384);

#ifndef SD_CUDA_EVENTS
#define SD_CUDA_EVENTS 1
#endif

struct sd_alloc_key {
	u32 tgid;
	u32 pad;
	u64 ptr;
};

struct sd_alloc_value {
	u64 bytes;
	u64 caller;
	s32 device;
	u32 api;
};

/* not LRU: an evicted entry would be a leak never reported; a full map is counted.
 * Preallocated: a no-prealloc hash allocates per insert, measured slower per cuMemAlloc. */
BPF_TABLE("hash", struct sd_alloc_key, struct sd_alloc_value, live_allocs, 131072);
BPF_PERCPU_ARRAY(untracked_allocs, u64, 1);

static __always_inline int sd_in_runtime(u32 tid)
{
	u32 *depth = runtime_depth.lookup(&tid);
	return depth && *depth > 0;
}

/* Entry and exit of a runtime (cudaMalloc/cudaFree) call: the driver call it makes
 * underneath is then not counted a second time. */
static __always_inline void sd_runtime_enter(u32 tid)
{
	u32 zero = 0;
	u32 *depth = runtime_depth.lookup_or_try_init(&tid, &zero);
	if (depth)
		(*depth)++;
}

/* At a return probe: leave a runtime call, or say (1) that this driver return belongs to
 * a runtime call and is skipped. */
static __always_inline int sd_runtime_leave(u32 tid, int runtime)
{
	if (runtime) {
		u32 *depth = runtime_depth.lookup(&tid);
		if (depth && *depth > 0)
			(*depth)--;
		return 0;
	}
	return sd_in_runtime(tid);
}

static __always_inline s32 sd_driver_device(u32 tid)
{
	u64 *cuctx = thread_ctx.lookup(&tid);
	if (!cuctx)
		return SD_DEVICE_UNKNOWN;
	s32 *device = ctx_device.lookup(cuctx);
	return device ? *device : SD_DEVICE_UNKNOWN;
}

static __always_inline s32 sd_runtime_device(u32 tid)
{
	s32 *device = thread_rt_device.lookup(&tid);
	return device ? *device : 0;
}

static __always_inline int sd_alloc_enter(struct pt_regs *ctx, u32 api, int runtime)
{
	u64 id = bpf_get_current_pid_tgid();
	if (!sd_wanted(id >> 32))
		return 0;
	u32 tid = (u32)id;
	if (!runtime && sd_in_runtime(tid))
		return 0;
	struct sd_alloc_call call = {
		.out = PT_REGS_PARM1(ctx),
		.bytes = PT_REGS_PARM2(ctx),
		.caller = sd_caller(ctx),
		.api = api,
		.device = runtime ? sd_runtime_device(tid) : sd_driver_device(tid),
	};
	alloc_inflight.update(&tid, &call);
	if (runtime)
		sd_runtime_enter(tid);
	return 0;
}

static __always_inline int sd_alloc_return(struct pt_regs *ctx, int runtime)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	if (sd_runtime_leave(tid, runtime))
		return 0;
	struct sd_alloc_call *call = alloc_inflight.lookup(&tid);
	if (!call)
		return 0;
	s64 status = (s32)PT_REGS_RC(ctx);
	if (status == 0) {
		u64 ptr = 0;
		bpf_probe_read_user(&ptr, sizeof(ptr), (void *)call->out);
		struct sd_alloc_key key = {.tgid = bpf_get_current_pid_tgid() >> 32, .ptr = ptr};
		struct sd_alloc_value value = {.bytes = call->bytes, .caller = call->caller,
					       .device = call->device, .api = call->api};
		if (live_allocs.update(&key, &value) != 0) {
			int zero = 0;
			u64 *count = untracked_allocs.lookup(&zero);
			if (count)
				(*count)++;
		} else {
			s64 zero64 = 0;
			s64 *held = live_count.lookup_or_try_init(&key.tgid, &zero64);
			if (held)
				__sync_fetch_and_add(held, 1);
		}
#if SD_CUDA_EVENTS
		struct sd_event *e = sd_reserve(SD_EV_CUDA_ALLOC);
		if (e) {
			e->api = call->api;
			e->ptr = ptr;
			e->bytes = call->bytes;
			e->caller = call->caller;
			e->device = call->device;
			events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
		}
#endif
	}
	alloc_inflight.delete(&tid);
	return 0;
}

static __always_inline int sd_free_enter(struct pt_regs *ctx, u32 api, int runtime)
{
	u64 id = bpf_get_current_pid_tgid();
	if (!sd_wanted(id >> 32))
		return 0;
	u32 tid = (u32)id;
	if (!runtime && sd_in_runtime(tid))
		return 0;
	struct sd_alloc_call call = {
		.out = PT_REGS_PARM1(ctx),  /* the pointer being freed */
		.caller = sd_caller(ctx),
		.api = api,
		.device = SD_DEVICE_UNKNOWN,
	};
	alloc_inflight.update(&tid, &call);
	if (runtime)
		sd_runtime_enter(tid);
	return 0;
}

static __always_inline int sd_free_return(struct pt_regs *ctx, int runtime)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	if (sd_runtime_leave(tid, runtime))
		return 0;
	struct sd_alloc_call *call = alloc_inflight.lookup(&tid);
	if (!call)
		return 0;
	if ((s32)PT_REGS_RC(ctx) == 0 && call->out) {
		struct sd_alloc_key key = {.tgid = bpf_get_current_pid_tgid() >> 32, .ptr = call->out};
		if (live_allocs.delete(&key) == 0) {
			s64 *held = live_count.lookup(&key.tgid);
			if (held)
				__sync_fetch_and_add(held, -1);
		}
#if SD_CUDA_EVENTS
		struct sd_event *e = sd_reserve(SD_EV_CUDA_FREE);
		if (e) {
			e->api = call->api;
			e->ptr = call->out;
			e->caller = call->caller;
			events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
		}
#endif
	}
	alloc_inflight.delete(&tid);
	return 0;
}

/* One entry and one return handler per API, so the event says which API was called. */
#define SD_ALLOC_PROBES(name, api, runtime) \
	int sd_##name(struct pt_regs *ctx) { return sd_alloc_enter(ctx, api, runtime); } \
	int sd_##name##_return(struct pt_regs *ctx) { return sd_alloc_return(ctx, runtime); }
#define SD_FREE_PROBES(name, api, runtime) \
	int sd_##name(struct pt_regs *ctx) { return sd_free_enter(ctx, api, runtime); } \
	int sd_##name##_return(struct pt_regs *ctx) { return sd_free_return(ctx, runtime); }

SD_ALLOC_PROBES(cuMemAlloc_v2, SD_API_CU_MEM_ALLOC, 0)
SD_ALLOC_PROBES(cuMemAllocAsync, SD_API_CU_MEM_ALLOC_ASYNC, 0)
SD_ALLOC_PROBES(cuMemAllocManaged, SD_API_CU_MEM_ALLOC_MANAGED, 0)
SD_ALLOC_PROBES(cuMemAllocFromPoolAsync, SD_API_CU_MEM_ALLOC_FROM_POOL_ASYNC, 0)
SD_FREE_PROBES(cuMemFree_v2, SD_API_CU_MEM_FREE, 0)
SD_FREE_PROBES(cuMemFreeAsync, SD_API_CU_MEM_FREE_ASYNC, 0)
SD_ALLOC_PROBES(cudaMalloc, SD_API_CUDA_MALLOC, 1)
SD_ALLOC_PROBES(cudaMallocManaged, SD_API_CUDA_MALLOC_MANAGED, 1)
SD_ALLOC_PROBES(cudaMallocAsync, SD_API_CUDA_MALLOC_ASYNC, 1)
SD_FREE_PROBES(cudaFree, SD_API_CUDA_FREE, 1)
SD_FREE_PROBES(cudaFreeAsync, SD_API_CUDA_FREE_ASYNC, 1)

/* Which device each context belongs to, and which context each thread has current. */
static __always_inline int sd_ctx_enter(struct pt_regs *ctx, u64 out, s32 device)
{
	u64 id = bpf_get_current_pid_tgid();
	if (!sd_wanted(id >> 32))
		return 0;
	u32 tid = (u32)id;
	struct sd_alloc_call call = {.out = out, .device = device};
	ctx_inflight.update(&tid, &call);
	return 0;
}

static __always_inline int sd_ctx_return(struct pt_regs *ctx, int make_current)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	struct sd_alloc_call *call = ctx_inflight.lookup(&tid);
	if (!call)
		return 0;
	if ((s32)PT_REGS_RC(ctx) == 0) {
		u64 cuctx = 0;
		bpf_probe_read_user(&cuctx, sizeof(cuctx), (void *)call->out);
		s32 device = call->device;
		ctx_device.update(&cuctx, &device);
		if (make_current)
			thread_ctx.update(&tid, &cuctx);
	}
	ctx_inflight.delete(&tid);
	return 0;
}

/* cuCtxCreate_v2(CUcontext *pctx, unsigned flags, CUdevice dev): new and current */
int sd_cuCtxCreate_v2(struct pt_regs *ctx) { return sd_ctx_enter(ctx, PT_REGS_PARM1(ctx), (s32)PT_REGS_PARM3(ctx)); }
int sd_cuCtxCreate_v2_return(struct pt_regs *ctx) { return sd_ctx_return(ctx, 1); }
/* cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *, int n, unsigned flags, CUdevice dev) */
int sd_cuCtxCreate_v3(struct pt_regs *ctx) { return sd_ctx_enter(ctx, PT_REGS_PARM1(ctx), (s32)PT_REGS_PARM5(ctx)); }
int sd_cuCtxCreate_v3_return(struct pt_regs *ctx) { return sd_ctx_return(ctx, 1); }
/* cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *, unsigned flags, CUdevice dev): CUDA 13's cuCtxCreate */
int sd_cuCtxCreate_v4(struct pt_regs *ctx) { return sd_ctx_enter(ctx, PT_REGS_PARM1(ctx), (s32)PT_REGS_PARM4(ctx)); }
int sd_cuCtxCreate_v4_return(struct pt_regs *ctx) { return sd_ctx_return(ctx, 1); }
/* cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev): not made current */
int sd_cuDevicePrimaryCtxRetain(struct pt_regs *ctx) { return sd_ctx_enter(ctx, PT_REGS_PARM1(ctx), (s32)PT_REGS_PARM2(ctx)); }
int sd_cuDevicePrimaryCtxRetain_return(struct pt_regs *ctx) { return sd_ctx_return(ctx, 0); }

static __always_inline int sd_set_current(u64 cuctx)
{
	u64 id = bpf_get_current_pid_tgid();
	if (!sd_wanted(id >> 32))
		return 0;
	u32 tid = (u32)id;
	thread_ctx.update(&tid, &cuctx);
	return 0;
}

int sd_cuCtxSetCurrent(struct pt_regs *ctx) { return sd_set_current(PT_REGS_PARM1(ctx)); }
int sd_cuCtxPushCurrent_v2(struct pt_regs *ctx) { return sd_set_current(PT_REGS_PARM1(ctx)); }

/* cudaSetDevice(int device) */
int sd_cudaSetDevice(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	if (!sd_wanted(id >> 32))
		return 0;
	u32 tid = (u32)id;
	s32 device = (s32)PT_REGS_PARM1(ctx);
	thread_rt_device.update(&tid, &device);
	return 0;
}
