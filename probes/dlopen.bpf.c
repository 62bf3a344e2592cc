/* dlopen and dlmopen, on entry and on return: the path asked for, the flags, the
 * namespace, and the handle (NULL on failure).  A glibc handle is the object's struct
 * link_map, whose l_name (the second field in <link.h>, a public debugger ABI) is the
 * file the loader really opened.
 *
 * dlsym/dlvsym are probed only to know that a loader error was raised by a lookup the
 * caller may expect to miss (see loader_errors.bpf.c).
 */
#include "common.bpf.h"

struct sd_dlopen_args {
	u64 path;
	u64 flags;
	s64 lmid;
	u32 api;
};

BPF_TABLE("lru_hash", u32, u32, dl_depth, 16384);
BPF_TABLE("lru_hash", struct sd_call_key, struct sd_dlopen_args, dl_inflight, 16384);
BPF_TABLE("lru_hash", u32, u32, dlsym_active, 16384);

static __always_inline int sd_dlopen_enter(struct pt_regs *ctx, u64 path, u64 flags, s64 lmid, u32 api)
{
	u64 id = bpf_get_current_pid_tgid();
	if (!sd_wanted(id >> 32))
		return 0;
	u32 tid = (u32)id;
	u32 zero = 0;
	u32 *depth = dl_depth.lookup_or_try_init(&tid, &zero);
	if (!depth)
		return 0;
	struct sd_call_key key = {.tid = tid, .depth = *depth};
	struct sd_dlopen_args call = {.path = path, .flags = flags, .lmid = lmid, .api = api};
	dl_inflight.update(&key, &call);
	(*depth)++;

	struct sd_event *e = sd_reserve(SD_EV_DLOPEN);
	if (!e)
		return 0;
	e->api = api;
	e->bytes = flags;
	e->ns = lmid;
	e->caller = sd_caller(ctx);
	e->ptr = path;  /* a string not yet paged in cannot be read here; the return event has it */
	if (path)
		bpf_probe_read_user_str(e->path, sizeof(e->path), (void *)path);
	events.ringbuf_submit(e, 0);
	return 0;
}

int sd_dlopen(struct pt_regs *ctx)
{
	return sd_dlopen_enter(ctx, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0, SD_API_DLOPEN);
}

int sd_dlmopen(struct pt_regs *ctx)
{
	return sd_dlopen_enter(ctx, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), (s64)PT_REGS_PARM1(ctx), SD_API_DLMOPEN);
}

int sd_dlopen_return(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	if (!sd_wanted(id >> 32))
		return 0;
	u32 tid = (u32)id;
	u32 *depth = dl_depth.lookup(&tid);
	if (!depth || *depth == 0)
		return 0;  /* entered before the probes were attached */
	(*depth)--;
	struct sd_call_key key = {.tid = tid, .depth = *depth};
	struct sd_dlopen_args *call = dl_inflight.lookup(&key);
	if (!call)
		return 0;
	struct sd_event *e = sd_reserve(SD_EV_DLOPEN_RET);
	if (e) {
		u64 handle = PT_REGS_RC(ctx);
		e->api = call->api;
		e->bytes = call->flags;
		e->ns = call->lmid;
		e->ptr = handle;
		e->ret = handle != 0;
		if (call->path)
			bpf_probe_read_user_str(e->path, sizeof(e->path), (void *)call->path);
		if (handle) {
			u64 name = 0;
			bpf_probe_read_user(&name, sizeof(name), (void *)(handle + 8));
			if (name)
				bpf_probe_read_user_str(e->text, sizeof(e->text), (void *)name);
		}
		events.ringbuf_submit(e, 0);
	}
	dl_inflight.delete(&key);
	return 0;
}

int sd_dlsym(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	if (!sd_wanted(id >> 32))
		return 0;
	u32 tid = (u32)id, one = 1;
	dlsym_active.update(&tid, &one);
	return 0;
}

int sd_dlsym_return(struct pt_regs *ctx)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	dlsym_active.delete(&tid);
	return 0;
}
