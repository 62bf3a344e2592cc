/* What every probe program shares: the ring buffer, the lost-event counter and the
 * process filter.  Included once, first, when seedance.probes.loader joins the
 * programs into one BPF module (one compile per session).
 *
 * Compile-time constants (set by the loader with -D, never spliced into the text):
 *   SD_FILTER_PIDS  1: only processes in `traced` (and their children) are reported
 *   SD_RINGBUF_PAGES  ring buffer size in pages (power of two)
 */
#ifndef SEEDANCE_COMMON_BPF_H
#define SEEDANCE_COMMON_BPF_H
#include <uapi/linux/ptrace.h>
#include "events.h"

#ifndef SD_FILTER_PIDS
#define SD_FILTER_PIDS 0
#endif
#ifndef SD_RINGBUF_PAGES
#define SD_RINGBUF_PAGES 256
#endif

/* A ring buffer (not per-CPU perf buffers): one global order, so an allocation is never
 * read after the exit of the process that made it. */
BPF_RINGBUF_OUTPUT(events, SD_RINGBUF_PAGES);
BPF_PERCPU_ARRAY(lost, u64, 1);
BPF_HASH(traced, u32, u8, 65536);
/* Processes seedance launched itself: stopped (SIGSTOP) when a CUDA library appears in
 * their link map so its uprobes are attached before the first allocation. */
BPF_HASH(gated, u32, u8, 4096);
/* Bumped at each exec: the link-map walk keys what it has seen by (pid, image), so an
 * image exec'd at the same addresses (ASLR off) is reported again. */
BPF_TABLE("lru_hash", u32, u32, exec_generation, 65536);
/* Device allocations each process holds (cudamem.bpf.c), so an exit says whether there is
 * anything to look up in live_allocs at all. */
BPF_HASH(live_count, u32, s64, 65536);

static __always_inline int sd_wanted(u32 tgid)
{
#if SD_FILTER_PIDS
	return traced.lookup(&tgid) != NULL;
#else
	return 1;
#endif
}

static __always_inline struct sd_event *sd_reserve(u32 type)
{
	struct sd_event *e = events.ringbuf_reserve(sizeof(struct sd_event));
	if (!e) {
		int zero = 0;
		u64 *count = lost.lookup(&zero);
		if (count)
			(*count)++;
		return NULL;
	}
	u64 id = bpf_get_current_pid_tgid();
	/* ring buffer memory is not zeroed: set every field */
	e->ts_ns = bpf_ktime_get_ns();
	e->type = type;
	e->pid = id >> 32;
	e->tid = (u32)id;
	e->api = 0;
	e->context = 0;
	e->flags = 0;
	e->device = SD_DEVICE_UNKNOWN;
	e->aux = 0;
	e->ret = 0;
	e->ns = 0;
	e->ptr = 0;
	e->bytes = 0;
	e->base = 0;
	e->caller = 0;
	e->path[0] = 0;
	e->text[0] = 0;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	return e;
}

/* The return address at a function's first instruction: the caller, for attribution. */
static __always_inline u64 sd_caller(struct pt_regs *ctx)
{
	u64 ret_addr = 0;
	bpf_probe_read_user(&ret_addr, sizeof(ret_addr), (void *)PT_REGS_SP(ctx));
	return ret_addr;
}

/* Per-thread, per-depth key for entry/return pairs, so a nested call (a constructor
 * that dlopens) does not overwrite its caller's arguments. */
struct sd_call_key {
	u32 tid;
	u32 depth;
};

#endif
