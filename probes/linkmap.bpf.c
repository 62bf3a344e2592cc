/* The map of loaded objects, from the loader's own debugger interface.
 *
 * ld.so calls _dl_debug_state() (an empty function that exists to be breakpointed, as
 * gdb does) every time a namespace's list of objects changes, and r_debug/link_map are
 * the public <link.h> ABI.  On each call the lists of every namespace are walked
 * (_r_debug, then r_debug_extended.r_next, glibc 2.35+) and each link map not seen
 * before in this process is reported once: path (l_name), l_addr, namespace.
 * Inode and SONAME are read from the file by Python.  Why not mmap/openat tracepoints:
 * see docs/trace.md (they need kernel struct walks, unsafe with mismatched headers, and
 * know nothing about namespaces or what the loader kept).
 *
 * Constants from the loader (read from ld.so's symbol table):
 *   SD_LDSO_DEBUG_STATE_OFF  file offset of _dl_debug_state
 *   SD_LDSO_R_DEBUG_OFF      offset of _r_debug
 */
#include "common.bpf.h"

#define SD_MAX_OBJECTS 512
#define SD_MAX_NS 8
#define SD_SIGSTOP 19

struct sd_lm_key {
	u32 tgid;
	u32 generation;
	u64 link_map;
};

struct sd_lm_seen {
	u64 l_addr;
	u64 l_name;
};

BPF_TABLE("lru_hash", struct sd_lm_key, struct sd_lm_seen, lm_seen, 131072);

/* link_map's first five fields (<link.h>) */
struct sd_link_map {
	u64 l_addr;
	u64 l_name;
	u64 l_ld;
	u64 l_next;
	u64 l_prev;
};

struct sd_walk {
	u64 lm;
	u64 rdebug;
	s64 ns;
	u32 index;
	int version;
	u32 tgid;
	u32 generation;
	int gate;
	int stopped;
};

/* The walk runs in chunks chained by tail calls: a single 512-step loop exceeds the
 * verifier's complexity limit, and bcc cannot pass bpf_loop a callback.  The state lives
 * in a per-CPU slot; a uprobe program is not re-entered on one CPU (bpf_prog_active),
 * so no other walk can overwrite it mid-way. */
#define SD_WALK_CHUNK 16
BPF_PROG_ARRAY(walk_chunks, 1);
BPF_PERCPU_ARRAY(walk_state, struct sd_walk, 1);

/* One object of the walk; returns 1 when the walk is over. */
static __always_inline int sd_walk_step(struct sd_walk *w)
{
	if (w->index >= SD_MAX_OBJECTS)
		return 1;
	w->index++;
	if (!w->lm) {
		/* end of this namespace: r_debug_extended.r_next (r_version >= 2) */
		if (w->version < 2 || w->ns + 1 >= SD_MAX_NS)
			return 1;
		u64 next = 0;
		bpf_probe_read_user(&next, sizeof(next), (void *)(w->rdebug + 40));
		if (!next)
			return 1;
		w->rdebug = next;
		w->ns++;
		bpf_probe_read_user(&w->lm, sizeof(w->lm), (void *)(next + 8));
		return 0;
	}
	struct sd_link_map map = {};
	if (bpf_probe_read_user(&map, sizeof(map), (void *)w->lm) != 0)
		return 1;
	struct sd_lm_key key = {.tgid = w->tgid, .generation = w->generation, .link_map = w->lm};
	struct sd_lm_seen *seen = lm_seen.lookup(&key);
	if (!seen || seen->l_addr != map.l_addr || seen->l_name != map.l_name) {
		struct sd_lm_seen now = {.l_addr = map.l_addr, .l_name = map.l_name};
		lm_seen.update(&key, &now);
		struct sd_event *e = sd_reserve(SD_EV_OBJECT);
		if (e) {
			if (map.l_name)
				bpf_probe_read_user_str(e->path, sizeof(e->path), (void *)map.l_name);
			e->ptr = w->lm;
			e->base = map.l_addr;
			e->ns = w->ns;
			e->aux = w->index;
			/* a launched process stops (once per walk) so Python can attach the CUDA
			 * probes of what just appeared before any of it runs; Python sends SIGCONT */
			if (w->gate && !w->stopped) {
				bpf_send_signal(SD_SIGSTOP);
				w->stopped = 1;
				e->flags = SD_FLAG_STOPPED;
			}
			events.ringbuf_submit(e, 0);
		}
	}
	w->lm = map.l_next;
	return 0;
}

int sd_walk_chunk(struct pt_regs *ctx)
{
	int zero = 0;
	struct sd_walk *w = walk_state.lookup(&zero);
	if (!w)
		return 0;
#pragma unroll
	for (int i = 0; i < SD_WALK_CHUNK; i++) {
		if (sd_walk_step(w))
			return 0;
	}
	walk_chunks.call(ctx, 0);
	return 0;
}

int sd_debug_state(struct pt_regs *ctx)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!sd_wanted(tgid))
		return 0;
	int zero = 0;
	struct sd_walk *w = walk_state.lookup(&zero);
	if (!w)
		return 0;
	/* ld.so is mapped page-aligned: its base from the probed address, then _r_debug */
	u64 base = (PT_REGS_IP(ctx) - SD_LDSO_DEBUG_STATE_OFF) & ~0xfffULL;
	w->rdebug = base + SD_LDSO_R_DEBUG_OFF;
	w->lm = 0;
	w->ns = 0;
	w->index = 0;
	w->version = 0;
	w->tgid = tgid;
	u32 *generation = exec_generation.lookup(&tgid);
	w->generation = generation ? *generation : 0;
	w->gate = gated.lookup(&tgid) != NULL;
	w->stopped = 0;
	bpf_probe_read_user(&w->version, sizeof(w->version), (void *)w->rdebug);
	bpf_probe_read_user(&w->lm, sizeof(w->lm), (void *)(w->rdebug + 8));
	walk_chunks.call(ctx, 0);
	return 0;
}
