/* Process lifecycle from the scheduler tracepoints: exec, exit, and fork (only to
 * extend the PID filter to children; forks are not reported as events). */
#include "common.bpf.h"

TRACEPOINT_PROBE(sched, sched_process_fork)
{
	u32 parent = args->parent_pid;
	u32 child = args->child_pid;
	u8 one = 1;
	if (traced.lookup(&parent))
		traced.update(&child, &one);
	if (gated.lookup(&parent))
		gated.update(&child, &one);
	return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!sd_wanted(tgid))
		return 0;
	u32 zero = 0;
	u32 *generation = exec_generation.lookup_or_try_init(&tgid, &zero);
	if (generation)
		(*generation)++;
	s64 *held = live_count.lookup(&tgid);
	s64 allocations = held ? *held : 0;
	live_count.delete(&tgid);  /* the old image's memory: reported with this exec */
	struct sd_event *e = sd_reserve(SD_EV_EXEC);
	if (!e)
		return 0;
	e->bytes = allocations;
	unsigned short offset = args->data_loc_filename & 0xFFFF;
	bpf_probe_read_kernel_str(e->path, sizeof(e->path), (void *)args + offset);
	e->aux = args->old_pid;
	events.ringbuf_submit(e, 0);
	return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
#ifdef SD_HAVE_GROUP_DEAD
	if (!args->group_dead)
		return 0;
#else
	/* older kernels: the thread-group leader's exit stands for the process */
	if ((u32)id != tgid)
		return 0;
#endif
	if (!sd_wanted(tgid))
		return 0;
	s64 *held = live_count.lookup(&tgid);
	struct sd_event *e = sd_reserve(SD_EV_EXIT);
	if (e) {
		e->bytes = held ? *held : 0;  /* allocations still live: 0 = nothing to look up */
		events.ringbuf_submit(e, 0);
	}
	live_count.delete(&tgid);
	traced.delete(&tgid);
	gated.delete(&tgid);
	return 0;
}
