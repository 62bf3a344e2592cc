/* The peer of bench/bench_trace.py: the least a bcc uprobe can do (count calls in an
 * array), to show what seedance's probes cost above the uprobe mechanism itself. */
#include <uapi/linux/ptrace.h>

BPF_ARRAY(bare_calls, u64, 1);

static __always_inline int bare_count(void)
{
	int zero = 0;
	u64 *count = bare_calls.lookup(&zero);
	if (count)
		__sync_fetch_and_add(count, 1);
	return 0;
}

int bare_enter(struct pt_regs *ctx) { return bare_count(); }
int bare_return(struct pt_regs *ctx) { return bare_count(); }
