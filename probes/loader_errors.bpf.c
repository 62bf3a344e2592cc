/* The dynamic loader's own error messages.
 *
 * Every error ld.so raises (a missing file, a missing version node, an undefined symbol)
 * is built by _dl_exception_create or _dl_exception_create_format (elf/dl-exception.c),
 * both exported GLIBC_PRIVATE from ld-linux-x86-64.so.2 in glibc 2.34+ (libc.so.6 only
 * imports them).  Probing the constructors rather than _dl_signal_error/_dl_signal_exception
 * gives the formatted message in one place whatever happens next (signalled, caught by
 * dlopen, or continued through _dl_signal_cexception).  On return the struct dl_exception {objname, errstring, ...} is filled:
 * objname is the object the loader blames, errstring the formatted message, exactly as
 * dlerror() and the "error while loading shared libraries" line print them.
 *
 * Needs dlopen.bpf.c (dl_depth, dlsym_active) for the context.
 */
#include "common.bpf.h"

BPF_TABLE("lru_hash", u32, u64, exc_inflight, 16384);

int sd_exception_create(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	if (!sd_wanted(id >> 32))
		return 0;
	u32 tid = (u32)id;
	u64 exception = PT_REGS_PARM1(ctx);
	exc_inflight.update(&tid, &exception);
	return 0;
}

int sd_exception_create_return(struct pt_regs *ctx)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	u64 *exception = exc_inflight.lookup(&tid);
	if (!exception)
		return 0;
	u64 fields[2] = {0, 0};  /* objname, errstring */
	bpf_probe_read_user(fields, sizeof(fields), (void *)*exception);
	exc_inflight.delete(&tid);
	struct sd_event *e = sd_reserve(SD_EV_LOADER_ERROR);
	if (!e)
		return 0;
	if (fields[0])
		bpf_probe_read_user_str(e->path, sizeof(e->path), (void *)fields[0]);
	if (fields[1])
		bpf_probe_read_user_str(e->text, sizeof(e->text), (void *)fields[1]);
	u32 *depth = dl_depth.lookup(&tid);
	if (dlsym_active.lookup(&tid))
		e->context = SD_CTX_DLSYM;
	else if (depth && *depth > 0)
		e->context = SD_CTX_DLOPEN;
	else
		e->context = SD_CTX_STARTUP;
	events.ringbuf_submit(e, 0);
	return 0;
}
