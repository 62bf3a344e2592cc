/*
 * launcher.c: `seedance-run`, the fast front end of `seedance run`.
 *
 * `seedance run` in Python costs a Python start-up per program (the interpreter, site and
 * the CLI's imports); the shim by raw LD_PRELOAD costs only ld.so loading one more library,
 * orders of magnitude less (bench/bench_shim.py times both).  This small
 * program, built with the shim and installed next to it, runs the common case itself
 * with every check `seedance run` makes, and hands everything else to the Python
 * implementation unchanged (execv, same arguments):
 *
 *   here:    --mem-limit, --affinity (ordinals, npuN, gpu:N, GPU-/MIG- UUIDs; gpu:N and N
 *            become the UUID of NVML index N when NVML answers, as in Python),
 *            --follow-children, --handles, --audit, --strict (an --affinity index the
 *            driver does not have: a warning, or refused);
 *            checks: command found (exit 127/126 as env(1); a file without #! runs as a
 *            /bin/sh script, as execvp runs it), preload safety (the library and every directory
 *            above it owned by root or the user and not group/world-writable, sticky
 *            directories as in seedance/preload.py), setuid/setgid and static programs
 *            named (they run unwrapped), launchers without --follow-children named,
 *            an inherited SEEDANCE_DISABLE said, sizes and spellings refused in one
 *            line with exit 2; after the program: an affinity that named no device and
 *            a full registry said, the run's slots reclaimed and its group released.
 *   Python:  -o/--report-json, --events, --force, --affinity auto, --help, a shim.yaml
 *            holding the --handles default, anything not understood here, and every
 *            run that ended holding memory (the handle-leak findings come from the rule
 *            engine, which is Python: `seedance run --finish-group KEY`).
 *
 * The messages are the Python command's; tests/shim runs the same cases through both.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../include/seedance_shim.h"

#ifndef SD_VERSION_STRING
#define SD_VERSION_STRING "0.1.0"
#endif
#ifndef SD_PYTHON
#define SD_PYTHON "python3"
#endif
/* -P (Python 3.11+): `python -m` would put the working directory first on sys.path, and a
 * seedance.py there would run instead of seedance (-E would drop PYTHONPATH too).  The
 * build defines it empty for an older Python, which has no such flag. */
#ifndef SD_PYTHON_SAFE_PATH
#define SD_PYTHON_SAFE_PATH "-P"
#endif
/* what `python -m seedance` runs (agent/__main__.py), given to -c: -m would import runpy
 * and search sys.path for the package first, on every command */
#define SD_PYTHON_ENTRY "from seedance.cli import console; console(front_end=False)"
#define STR2(x) #x
#define STR(x) STR2(x)

extern char **environ;

static char **orig_argv;

/* ---- the Python implementation, for everything this program does not do ---------- */

/* A wheel's build knows where an install puts things only relative to each other: the
 * interpreter (in a venv, bin/python3.X beside the scripts), the package's shim directory
 * (lib/python3.X/site-packages/seedance/shim).  The build defines these paths relative to
 * each of the launcher's two installed copies (build_shim.py); an editable build leaves them
 * empty, as the launcher stays in shim/ and SD_PYTHON is the venv's interpreter. */
#ifndef SD_PYTHON_NEAR_PACKAGE
#define SD_PYTHON_NEAR_PACKAGE ""
#endif
#ifndef SD_PYTHON_NEAR_SCRIPTS
#define SD_PYTHON_NEAR_SCRIPTS ""
#endif
#ifndef SD_SHIM_NEAR_SCRIPTS
#define SD_SHIM_NEAR_SCRIPTS ""
#endif

/* <this program's directory>/REL into OUT when REL is set and names a file there: 0 */
static int near_self(const char *rel, char *out, size_t len)
{
    char self[PATH_MAX];
    ssize_t n = rel[0] ? readlink("/proc/self/exe", self, sizeof self - 1) : -1;
    if (n <= 0)
        return -1;
    self[n] = '\0';
    *strrchr(self, '/') = '\0';
    if ((size_t)snprintf(out, len, "%s/%s", self, rel) >= len || access(out, F_OK) != 0)
        return -1;
    return 0;
}

/* The interpreter this install belongs to (found beside the launcher's copy, as above), else
 * the one seedance was built with; a wheel installed elsewhere may have neither, then
 * whatever python3 is on PATH (it must import seedance too). */
static void exec_python(char **argv)
{
    static char near[PATH_MAX];
    if (near_self(SD_PYTHON_NEAR_PACKAGE, near, sizeof near) == 0 ||
        near_self(SD_PYTHON_NEAR_SCRIPTS, near, sizeof near) == 0) {
        argv[0] = near;
        execv(near, argv);
    }
    argv[0] = (char *)SD_PYTHON;
    execv(SD_PYTHON, argv);
    argv[0] = (char *)"python3";
    execvp("python3", argv);
}

/* Exec the Python CLI with ``args`` (n of them; "run" first for `seedance run`): returns
 * only when no interpreter could be started */
static void exec_cli(char *const *args, int n)
{
    char **argv = calloc((size_t)n + 5, sizeof *argv);
    if (!argv)
        _exit(2);
    int at = 0;
    argv[at++] = (char *)SD_PYTHON;
    if (SD_PYTHON_SAFE_PATH[0]) /* (empty for a Python before 3.11, which has no -P) */
        argv[at++] = (char *)SD_PYTHON_SAFE_PATH;
    argv[at++] = (char *)"-c";
    argv[at++] = (char *)SD_PYTHON_ENTRY;
    for (int i = 0; i < n; i++)
        argv[at++] = args[i];
    exec_python(argv);
}

static void to_python(void)
{
    int n = 0;
    while (orig_argv[n])
        n++;
    orig_argv[0] = (char *)"run"; /* `seedance-run ARGS` is `seedance run ARGS` */
    exec_cli(orig_argv, n);
    fprintf(stderr, "seedance: error: run: cannot start %s: %s\n", SD_PYTHON, strerror(errno));
    exit(2);
}

__attribute__((format(printf, 1, 2), noreturn)) static void usage_error(const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    for (char *p = text; *p; p++) /* one line, always: a control character cannot forge another */
        if ((unsigned char)*p < 0x20)
            *p = ' ';
    fprintf(stderr, "seedance: error: run: %s\n", text);
    exit(2);
}

/* The command cannot be started: one line, and the exit code env(1), timeout(1) and the
 * shells give (coreutils env.c): 127 when it is not found, 126 when it cannot be run */
#define EXIT_NOT_FOUND 127
#define EXIT_CANNOT_INVOKE 126
__attribute__((format(printf, 2, 3), noreturn)) static void cannot_run(int code, const char *fmt, ...)
{
    char text[PATH_MAX + 128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    for (char *p = text; *p; p++)
        if ((unsigned char)*p < 0x20)
            *p = ' ';
    fprintf(stderr, "seedance: error: run: %s\n", text);
    exit(code);
}

/* Python's repr() of a plain string, for messages that quote what the user typed */
static const char *quoted(const char *s)
{
    static char buf[2][600];
    static int which;
    char *out = buf[which ^= 1];
    char q = strchr(s, '\'') && !strchr(s, '"') ? '"' : '\'';
    size_t n = 0;
    out[n++] = q;
    for (; *s && n < sizeof buf[0] - 6; s++) {
        if (*s == q || *s == '\\')
            out[n++] = '\\';
        out[n++] = *s;
    }
    out[n++] = q;
    out[n] = '\0';
    return out;
}

/* ---- sizes: the grammar of seedance.model.units.parse_size ------------------------ */

/* Kubernetes quantities (8Gi, 1.5G, 512Mi; a bare number is bytes; an optional trailing B),
 * a fraction rounded up to a whole byte as resource.Quantity.Value() does; at most 2^64-1
 * bytes and 18 decimal places, so every step below is exact in 128 bits */
#define SIZE_NOT "--mem-limit: %s is not a size (e.g. 8Gi, 1.5G, 512Mi; a bare number is bytes)"
#define MAX_FRACTION_DIGITS 18

static uint64_t parse_size(const char *text)
{
    static const struct { const char *name; uint64_t mult; } suffixes[] = {
        {"Ki", 1ull << 10}, {"Mi", 1ull << 20}, {"Gi", 1ull << 30}, {"Ti", 1ull << 40},
        {"Pi", 1ull << 50}, {"Ei", 1ull << 60},
        {"k", 1000ull}, {"M", 1000000ull}, {"G", 1000000000ull}, {"T", 1000000000000ull},
        {"P", 1000000000000000ull}, {"E", 1000000000000000000ull},
    };
    const char *p = text, *end;
    while (isspace((unsigned char)*p))
        p++;
    end = p + strlen(p);
    while (end > p && isspace((unsigned char)end[-1]))
        end--;
    const char *start = p;
    uint64_t whole = 0, fraction = 0, pow10 = 1;
    int overflow = 0;
    size_t nwhole = 0, nfrac = 0;
    for (; p < end && isdigit((unsigned char)*p); p++, nwhole++) {
        unsigned d = (unsigned)(*p - '0');
        if (whole > (UINT64_MAX - d) / 10)
            overflow = 1;
        else
            whole = whole * 10 + d;
    }
    if (p < end && *p == '.')
        for (p++; p < end && isdigit((unsigned char)*p); p++, nfrac++)
            if (nfrac < MAX_FRACTION_DIGITS) {
                fraction = fraction * 10 + (uint64_t)(*p - '0');
                pow10 *= 10;
            }
    uint64_t mult = 1;
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        size_t l = strlen(suffixes[i].name);
        if ((size_t)(end - p) >= l && memcmp(p, suffixes[i].name, l) == 0) {
            mult = suffixes[i].mult;
            p += l;
            break;
        }
    }
    if (p < end && *p == 'B')
        p++;
    if (nwhole + nfrac == 0 || p != end || nfrac > MAX_FRACTION_DIGITS) {
        /* 512m: Kubernetes reads m as milli; Docker users mean MiB by it */
        const char *q = start;
        while (q < end && (isdigit((unsigned char)*q) || *q == '.'))
            q++;
        if (q > start && q < end && *q == 'm' && (q + 1 == end || (q[1] == 'B' && q + 2 == end)))
            usage_error("--mem-limit: %s: m is milli in a quantity; write Mi (1024*1024) or M (1000*1000)",
                        quoted(text));
        usage_error(SIZE_NOT, quoted(text));
    }
    unsigned __int128 value = (unsigned __int128)whole * mult
                              + ((unsigned __int128)fraction * mult + pow10 - 1) / pow10;
    if (overflow || value > UINT64_MAX)
        usage_error("--mem-limit: %s is too large (at most 2^64 - 1 bytes)", quoted(text));
    if (value == 0)
        usage_error("--mem-limit: %s must be more than 0", quoted(text));
    return (uint64_t)value;
}

/* "8Gi,1:4Gi" -> "8589934592,1:4294967296" (the shim's syntax, in bytes) */
static void parse_mem_limit(const char *text, char *out, size_t len)
{
    char buf[512], parts[SD_MAX_DEVICES + 1][48];
    int have_default = 0, nparts = 1;
    snprintf(buf, sizeof buf, "%s", text);
    parts[0][0] = '\0';
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*item))
            item++;
        size_t l = strlen(item);
        while (l && isspace((unsigned char)item[l - 1]))
            item[--l] = '\0';
        if (!*item)
            continue;
        char *colon = strchr(item, ':');
        if (colon) {
            *colon = '\0';
            char *dev = item, *end;
            while (isspace((unsigned char)*dev))
                dev++;
            long d = strtol(dev, &end, 10);
            while (isspace((unsigned char)*end))
                end++;
            if (!isdigit((unsigned char)*dev) || *end || d >= SD_MAX_DEVICES) {
                *colon = ':';
                usage_error("--mem-limit: %s: the device must be 0..%d", quoted(item), SD_MAX_DEVICES - 1);
            }
            if (nparts <= SD_MAX_DEVICES)
                snprintf(parts[nparts++], sizeof parts[0], "%ld:%llu", d, (unsigned long long)parse_size(colon + 1));
        } else {
            if (have_default)
                usage_error("--mem-limit: give one default size at most");
            have_default = 1;
            snprintf(parts[0], sizeof parts[0], "%llu", (unsigned long long)parse_size(item));
        }
    }
    if (!have_default && nparts == 1)
        usage_error("--mem-limit needs a size");
    size_t used = 0;
    out[0] = '\0';
    for (int i = have_default ? 0 : 1; i < nparts; i++)
        used += (size_t)snprintf(out + used, used < len ? len - used : 0, "%s%s", used ? "," : "", parts[i]);
}

/* ---- affinity: the spellings of seedance.run.limits.resolve_affinity -------------- */

/* gpu:N means NVML (nvidia-smi) index N: its UUID, when NVML answers; else the ordinal */
static void *nvml_lib;
static int nvml_ok;

static int nvml_uuid(int index, char *out, size_t len)
{
    static int tried;
    typedef int (*init_fn)(void);
    typedef int (*handle_fn)(unsigned, void **);
    typedef int (*uuid_fn)(void *, char *, unsigned);
    if (!tried) {
        tried = 1;
        nvml_lib = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
        init_fn init = nvml_lib ? (init_fn)dlsym(nvml_lib, "nvmlInit_v2") : NULL;
        nvml_ok = init && init() == 0;
    }
    if (!nvml_ok || index < 0)
        return -1;
    handle_fn get = (handle_fn)dlsym(nvml_lib, "nvmlDeviceGetHandleByIndex_v2");
    uuid_fn uuid = (uuid_fn)dlsym(nvml_lib, "nvmlDeviceGetUUID");
    void *h;
    return get && uuid && get((unsigned)index, &h) == 0 && uuid(h, out, (unsigned)len) == 0 ? 0 : -1;
}

/* How many devices gpu:N can name: NVML's count (gpu:N is the NVML index), else the CUDA
 * driver's (cuDeviceGetCount after cuInit); -1 with WHY when neither answers.  As
 * seedance.run.limits.device_count, whose words WHY repeats. */
static int device_count(const char **source, char *why, size_t len)
{
    char unused[8];
    nvml_uuid(-1, unused, 0); /* loads and initialises NVML once */
    typedef int (*count_fn)(unsigned *);
    unsigned n = 0;
    if (nvml_ok) {
        count_fn count = (count_fn)dlsym(nvml_lib, "nvmlDeviceGetCount_v2");
        if (count && count(&n) == 0) {
            *source = "NVML";
            return (int)n;
        }
    }
    const char *nvml_why = nvml_ok ? "NVML unavailable (nvmlDeviceGetCount failed)"
                           : nvml_lib ? "NVML unavailable (nvmlInit failed)"
                                      : "NVML unavailable (NVML Shared Library Not Found)";
    void *cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!cuda) {
        snprintf(why, len, "%s, and there is no CUDA driver (libcuda.so.1 does not load)", nvml_why);
        return -1;
    }
    typedef int (*init_fn)(unsigned);
    typedef int (*dev_count_fn)(int *);
    init_fn init = (init_fn)dlsym(cuda, "cuInit");
    dev_count_fn get = (dev_count_fn)dlsym(cuda, "cuDeviceGetCount");
    int devices = 0;
    if (!init || !get || init(0) != 0 || get(&devices) != 0) {
        snprintf(why, len, "%s, and the CUDA driver does not answer (cuInit failed)", nvml_why);
        return -1;
    }
    *source = "the CUDA driver";
    return devices;
}

/* The device indices of SPEC (gpu:N, N, npuN) this host does not have: a warning, or under
 * --strict a refusal (exit 2); when the count cannot be known, a warning that says so.  The
 * messages are seedance.run.limits.check_affinity_devices'. */
static void check_affinity_devices(const char *spec, int strict)
{
    char buf[512], absent[512] = "", wanted[512] = "";
    size_t absent_used = 0, wanted_used = 0;
    int indices[64], items = 0;
    snprintf(buf, sizeof buf, "%s", spec);
    char *names[64];
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item && items < 64; item = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*item))
            item++;
        size_t l = strlen(item);
        while (l && isspace((unsigned char)item[l - 1]))
            item[--l] = '\0';
        const char *digits = strncasecmp(item, "gpu:", 4) == 0 ? item + 4
                             : strncasecmp(item, "npu", 3) == 0 ? item + 3 : item;
        if (!*digits || strspn(digits, "0123456789") != strlen(digits))
            continue;
        names[items] = item;
        indices[items++] = atoi(digits);
    }
    if (!items)
        return;
    const char *source = NULL;
    char why[256];
    int count = device_count(&source, why, sizeof why);
    if (count < 0) {
        for (int k = 0; k < items; k++)
            wanted_used += (size_t)snprintf(wanted + wanted_used, wanted_used < sizeof wanted ? sizeof wanted - wanted_used : 0,
                                            "%s%d", k ? ", " : "", indices[k]);
        fprintf(stderr, "seedance: warning: --affinity %s: cannot check that device %s exists: %s\n", spec, wanted, why);
        return;
    }
    for (int k = 0; k < items; k++)
        if (indices[k] >= count)
            absent_used += (size_t)snprintf(absent + absent_used, absent_used < sizeof absent ? sizeof absent - absent_used : 0,
                                            "%s%s", absent_used ? ", " : "", names[k]);
    if (!absent[0])
        return;
    char text[1400];
    snprintf(text, sizeof text, "--affinity %s: no device %s on this host (%s reports %d device%s): the program would see none",
             spec, absent, source, count, count == 1 ? "" : "s");
    if (strict)
        usage_error("%s", text);
    fprintf(stderr, "seedance: warning: %s\n", text);
}

static void resolve_affinity(const char *spec, char *out, size_t len)
{
    char buf[512];
    size_t used = 0;
    snprintf(buf, sizeof buf, "%s", spec);
    out[0] = '\0';
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*item))
            item++;
        size_t l = strlen(item);
        while (l && isspace((unsigned char)item[l - 1]))
            item[--l] = '\0';
        if (!*item)
            continue;
        char value[128];
        const char *digits = NULL;
        if (strncasecmp(item, "gpu:", 4) == 0)
            digits = item + 4;
        else if (strncasecmp(item, "npu", 3) == 0 && item[3] && strspn(item + 3, "0123456789") == strlen(item + 3))
            digits = item + 3;
        else if (isdigit((unsigned char)*item))
            digits = item;
        if (digits && *digits && strspn(digits, "0123456789") == strlen(digits)) {
            if (nvml_uuid(atoi(digits), value, sizeof value) != 0)
                snprintf(value, sizeof value, "%s", digits);
        } else if (strncasecmp(item, "gpu-", 4) == 0 || strncasecmp(item, "mig-", 4) == 0) {
            snprintf(value, sizeof value, "%s", item);
        } else {
            usage_error("--affinity: %s is not gpu:N, N, npuN, GPU-<uuid>, MIG-<uuid> or auto", quoted(item));
        }
        used += (size_t)snprintf(out + used, used < len ? len - used : 0, "%s%s", used ? "," : "", value);
    }
}

/* ---- checks ---------------------------------------------------------------------- */

/* seedance/preload.py's unsafe_reason(path, owners=(0, euid)) */
static int unsafe_reason(const char *path, char *why, size_t len)
{
    char current[PATH_MAX];
    struct stat st;
    if (!realpath(path, current) || stat(current, &st) != 0) {
        snprintf(why, len, "%s: %s", path, strerror(errno));
        for (char *p = why + strlen(path) + 2; *p; p++)
            *p = (char)tolower((unsigned char)*p);
        return 1;
    }
    uid_t me = geteuid();
    int have_child = 0;
    uid_t child_owner = 0;
    for (;;) {
        if (st.st_mode & (S_IWGRP | S_IWOTH)) {
            int sticky_safe = S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX) && have_child &&
                              (child_owner == 0 || child_owner == me);
            if (!sticky_safe) {
                snprintf(why, len, "%s is %s-writable", current, (st.st_mode & S_IWOTH) ? "world" : "group");
                return 1;
            }
        }
        if (st.st_uid != 0 && st.st_uid != me) {
            snprintf(why, len, "%s belongs to uid %u", current, (unsigned)st.st_uid);
            return 1;
        }
        if (strcmp(current, "/") == 0)
            return 0;
        char *slash = strrchr(current, '/');
        if (slash == current)
            slash[1] = '\0';
        else
            *slash = '\0';
        have_child = 1;
        child_owner = st.st_uid;
        if (stat(current, &st) != 0) {
            snprintf(why, len, "%s: %s", current, strerror(errno));
            return 1;
        }
    }
}

/* 0 when execve could run CANDIDATE, else the errno it would give: ENOENT, EISDIR (execve
 * says EACCES), or EACCES (no execute bit, not a regular file) */
static int runnable(const char *candidate)
{
    struct stat st;
    if (stat(candidate, &st) != 0)
        return errno == ENOENT || errno == ENOTDIR ? ENOENT : EACCES;
    if (S_ISDIR(st.st_mode))
        return EISDIR;
    return S_ISREG(st.st_mode) && access(candidate, X_OK) == 0 ? 0 : EACCES;
}

/* The file execvp() would execute for NAME (glibc posix/execvpe.c): a name with a slash as it
 * is; else each PATH entry in order (an empty one is the current directory), skipping files
 * that exist but cannot be executed.  When none runs: exit 126 if such a file was met, else
 * 127, as env(1) reports it.  The messages are seedance.run.launch.find_command's. */
static void find_command(const char *name, char *out, size_t len)
{
    if (strchr(name, '/')) {
        int why = runnable(name);
        if (why == ENOENT)
            cannot_run(EXIT_NOT_FOUND, "%s: no such file or directory", name);
        if (why)
            cannot_run(EXIT_CANNOT_INVOKE, "%s: permission denied (%s)", name,
                       why == EISDIR ? "is a directory" : "not executable");
        snprintf(out, len, "%s", name);
        return;
    }
    if (!*name)
        cannot_run(EXIT_NOT_FOUND, "'': command not found");
    const char *path = getenv("PATH");
    if (!path)
        path = "/bin:/usr/bin"; /* os.defpath, which the Python command falls back to */
    char denied[PATH_MAX] = "";
    int denied_why = 0;
    for (;;) {
        size_t l = strcspn(path, ":");
        snprintf(out, len, "%.*s/%s", (int)l, l ? path : ".", name);
        int why = runnable(out);
        if (why == 0)
            return;
        if (why != ENOENT && !denied[0]) {
            snprintf(denied, sizeof denied, "%s", out);
            denied_why = why;
        }
        if (!path[l])
            break;
        path += l + 1;
    }
    if (denied[0])
        cannot_run(EXIT_CANNOT_INVOKE, "%s: permission denied (%s %s)", name, denied,
                   denied_why == EISDIR ? "is a directory" : "not executable");
    cannot_run(EXIT_NOT_FOUND, "%s: command not found", name);
}

/* 1: EXE never runs ld.so (no PT_INTERP), so LD_PRELOAD cannot reach it */
static int is_static_elf(const char *exe)
{
    int fd = open(exe, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    unsigned char h[64];
    int result = 0;
    if (read(fd, h, sizeof h) == (ssize_t)sizeof h && memcmp(h, "\177ELF", 4) == 0 && h[5] == 1 /* LE */) {
        uint64_t phoff;
        uint16_t phentsize, phnum;
        if (h[4] == 2) {
            memcpy(&phoff, h + 0x20, 8);
            memcpy(&phentsize, h + 0x36, 2);
            memcpy(&phnum, h + 0x38, 2);
        } else {
            uint32_t off32;
            memcpy(&off32, h + 0x1C, 4);
            phoff = off32;
            memcpy(&phentsize, h + 0x2A, 2);
            memcpy(&phnum, h + 0x2C, 2);
        }
        result = 1;
        for (unsigned i = 0; i < phnum && phentsize >= 4; i++) {
            uint32_t type;
            if (pread(fd, &type, 4, (off_t)(phoff + (uint64_t)i * phentsize)) != 4)
                break;
            if (type == 3 /* PT_INTERP */) {
                result = 0;
                break;
            }
        }
    }
    close(fd);
    return result;
}

/* Scripts (#!) and big-endian ELF: the Python command judges them (rare, not slow) */
static int needs_python_look(const char *exe)
{
    int fd = open(exe, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    unsigned char h[6] = {0};
    ssize_t n = read(fd, h, sizeof h);
    close(fd);
    return n >= 2 && ((h[0] == '#' && h[1] == '!') || (n == 6 && memcmp(h, "\177ELF", 4) == 0 && h[5] != 1));
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static int is_launcher(const char *exe)
{
    static const char *names[] = {"sh", "bash", "dash", "zsh", "env", "torchrun", "mpirun", "mpiexec", "srun",
                                  "xargs", "nohup"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(base_name(exe), names[i]) == 0)
            return 1;
    return 0;
}

/* the --handles default lives in a shim.yaml written by `seedance fix handle-leak`:
 * YAML is read by Python (bounded loader), so its presence sends the run there */
static int handles_config_exists(void)
{
    char path[PATH_MAX];
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    if (xdg && *xdg)
        snprintf(path, sizeof path, "%s/seedance/shim.yaml", xdg);
    else if (home && *home)
        snprintf(path, sizeof path, "%s/.config/seedance/shim.yaml", home);
    else
        return 0;
    return access(path, F_OK) == 0;
}

/* ---- after the program: the registry, through the shim's own helpers -------------- */

struct shim_api {
    int (*path)(char *, size_t);
    size_t (*size)(void);
    int (*group_slots)(void *, int, int *, int);
    int (*group_find)(void *, uint64_t);
    int (*slot_held)(void *, int, uint64_t *);
    int (*reclaim)(void *, int);
    int (*release)(void *, int);
    struct sd_slot *(*slot_ptr)(void *, int);
    struct sd_group *(*group_ptr)(void *, int);
};

static int load_shim_api(const char *library, struct shim_api *api)
{
    void *h = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return -1;
    *(void **)&api->path = dlsym(h, "seedance_registry_path");
    *(void **)&api->size = dlsym(h, "seedance_registry_size");
    *(void **)&api->group_slots = dlsym(h, "seedance_group_slots");
    *(void **)&api->group_find = dlsym(h, "seedance_group_find");
    *(void **)&api->slot_held = dlsym(h, "seedance_slot_held");
    *(void **)&api->reclaim = dlsym(h, "seedance_registry_reclaim");
    *(void **)&api->release = dlsym(h, "seedance_group_release");
    *(void **)&api->slot_ptr = dlsym(h, "seedance_registry_slot_ptr");
    *(void **)&api->group_ptr = dlsym(h, "seedance_registry_group_ptr");
    return api->path && api->size && api->group_slots && api->group_find && api->slot_held && api->reclaim && api->release &&
                   api->slot_ptr && api->group_ptr ? 0 : -1;
}

/* 1: something to report that only the Python report can say (memory held at exit) */
static int finish_run(const char *library, uint64_t key, const char *affinity_spec)
{
    struct shim_api api;
    if (load_shim_api(library, &api) != 0)
        return 1; /* let Python say what is wrong */
    char path[1024];
    if (api.path(path, sizeof path) < 0)
        return 0; /* no registry directory: the shim kept process-local state */
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return 0; /* no program of this run made a CUDA call */
    size_t size = api.size();
    struct stat st;
    void *base = fstat(fd, &st) == 0 && (size_t)st.st_size >= size
                     ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                     : MAP_FAILED;
    close(fd);
    if (base == MAP_FAILED)
        return 1;
    const struct sd_header *header = base;
    if (header->magic != (uint64_t)SD_MAGIC || header->abi_version != SD_ABI_VERSION) {
        munmap(base, size);
        return 1;
    }
    int group = api.group_find(base, key);
    if (group < 0) {
        munmap(base, size);
        return 0;
    }
    int slots[SD_MAX_SLOTS];
    int n = api.group_slots(base, group, slots, SD_MAX_SLOTS);
    int held_any = 0, saw_none = 0;
    for (int k = 0; k < n; k++) {
        uint64_t held[SD_MAX_DEVICES];
        api.slot_held(base, slots[k], held);
        for (int d = 0; d < SD_MAX_DEVICES; d++)
            held_any |= held[d] != 0;
        saw_none |= api.slot_ptr(base, slots[k])->nvisible == 0;
    }
    if (held_any) { /* handle-leak findings: the rule engine's (Python) */
        munmap(base, size);
        return 1;
    }
    if (affinity_spec && saw_none)
        fprintf(stderr, "seedance: note: --affinity %s named no device the driver has: the program saw none\n",
                affinity_spec);
    struct sd_group *g = api.group_ptr(base, group);
    unsigned total = g->overflow_total, refused = g->overflow_refused;
    if (total || refused) {
        fprintf(stderr, "seedance: note: the registry was full: %u process(es) of this run had no slot of their own; "
                        "they shared the run's quota", total + refused);
        if (refused)
            fprintf(stderr, " (%u could not even join it: their quota'd allocations were refused)", refused);
        fprintf(stderr, ", and their allocations are not itemised in the report\n");
    }
    for (int k = 0; k < n; k++)
        api.reclaim(base, slots[k]);
    api.release(base, group);
    munmap(base, size);
    return 0;
}

/* ---- the run ------------------------------------------------------------------- */

static pid_t child_pid;

static void forward(int sig)
{
    if (child_pid > 0)
        kill(child_pid, sig);
}

/* The child's environment is a copy: the launcher's own stays as it was, so neither the
 * shim it dlopens afterwards nor the Python it may exec runs with the run's settings. */
static char **child_env;
static size_t child_n, child_cap;

static void env_unset(const char *name)
{
    size_t l = strlen(name);
    for (size_t i = 0; i < child_n; i++)
        if (strncmp(child_env[i], name, l) == 0 && child_env[i][l] == '=') {
            child_env[i] = child_env[--child_n];
            child_env[child_n] = NULL;
            return;
        }
}

static void env_set(const char *name, const char *value)
{
    env_unset(name);
    if (child_n + 2 > child_cap) {
        child_cap = child_cap * 2 + 16;
        child_env = realloc(child_env, child_cap * sizeof *child_env);
        if (!child_env)
            exit(2);
    }
    size_t len = strlen(name) + strlen(value) + 2;
    char *entry = malloc(len);
    if (!entry)
        exit(2);
    snprintf(entry, len, "%s=%s", name, value);
    child_env[child_n++] = entry;
    child_env[child_n] = NULL;
}

static void env_copy(void)
{
    for (char **e = environ; *e; e++)
        child_n++;
    child_cap = child_n + 16;
    child_env = calloc(child_cap, sizeof *child_env);
    if (!child_env)
        exit(2);
    for (size_t i = 0; i < child_n; i++)
        child_env[i] = environ[i];
}

static void env_set_list_front(const char *var, const char *value)
{
    const char *old = getenv(var);
    if (!old || !*old) {
        env_set(var, value);
        return;
    }
    size_t len = strlen(value) + strlen(old) + 2;
    char *joined = malloc(len);
    if (!joined)
        exit(2);
    snprintf(joined, len, "%s:%s", value, old);
    env_set(var, joined);
}

/* Installed as `seedance` itself (the venv's bin/seedance links here, Makefile): a Python
 * console script pays a whole Python start-up before it can exec this launcher, many times
 * what the run it wraps costs.  As `seedance`, this program takes `seedance run ...`
 * itself and hands every other command to the Python CLI unchanged, which is what the
 * console script ran (cli.console, as `python -m seedance` runs it). */
static int front_end(int *argc, char ***argv)
{
    if (*argc < 1)
        return 0;
    const char *name = strrchr((*argv)[0], '/');
    name = name ? name + 1 : (*argv)[0];
    if (strcmp(name, "seedance") != 0)
        return 0; /* seedance-run */
    if (*argc >= 2 && strcmp((*argv)[1], "run") == 0) {
        (*argv)[1] = (*argv)[0]; /* `seedance run ARGS` is `seedance-run ARGS` */
        (*argc)--;
        (*argv)++;
        return 1;
    }
    exec_cli(*argv + 1, *argc - 1);
    fprintf(stderr, "seedance: error: cannot start %s: %s\n", SD_PYTHON, strerror(errno));
    exit(2);
}

/* OpenTelemetry asked for traces (the test seedance.telemetry.wanted makes): the run is
 * Python's then.  The run's span is made and exported by the OpenTelemetry SDK, and the
 * TRACEPARENT the program gets must name that span: a traceparent made up here would name
 * a span no collector ever receives, a broken parent link in every trace, and the shim's
 * events become events of that span.  Untraced runs keep this fast path. */
static int tracing_wanted(void)
{
    const char *off = getenv("OTEL_SDK_DISABLED");
    if (off && strcasecmp(off, "true") == 0)
        return 0;
    const char *exporters = getenv("OTEL_TRACES_EXPORTER");
    if (exporters && *exporters)
        return strcasecmp(exporters, "none") != 0;
    const char *traces = getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), *any = getenv("OTEL_EXPORTER_OTLP_ENDPOINT");
    return (traces && *traces) || (any && *any);
}

int main(int argc, char **argv)
{
    front_end(&argc, &argv);
    orig_argv = argv;
    if (tracing_wanted())
        to_python();
    const char *affinity = NULL, *mem_limit = NULL, *handles = NULL;
    int follow = 0, audit = 0, strict = 0, i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        const char *value = NULL;
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-')
            break; /* the command (argparse REMAINDER) */
        if (strcmp(a, "--follow-children") == 0) {
            follow = 1;
            continue;
        }
        if (strcmp(a, "--audit") == 0) {
            audit = 1;
            continue;
        }
        if (strcmp(a, "--strict") == 0) {
            strict = 1;
            continue;
        }
        const char **slot = strncmp(a, "--affinity", 10) == 0     ? &affinity
                            : strncmp(a, "--mem-limit", 11) == 0  ? &mem_limit
                            : strncmp(a, "--handles", 9) == 0     ? &handles
                                                                  : NULL;
        if (!slot)
            to_python(); /* -o, --report-json, --events, --force, --help, or a mistake */
        const char *eq = strchr(a, '=');
        size_t name_len = eq ? (size_t)(eq - a) : strlen(a);
        if (name_len != strlen(slot == &affinity ? "--affinity" : slot == &mem_limit ? "--mem-limit" : "--handles"))
            to_python(); /* an abbreviation or another option: argparse decides */
        if (eq)
            value = eq + 1;
        else if (i + 1 < argc)
            value = argv[++i];
        else
            to_python();
        *slot = value;
    }
    if (i >= argc)
        usage_error("give the command after --, e.g. seedance run -- python train.py");
    if (affinity && !*affinity) /* an empty value means "not given", as `if args.affinity:` */
        affinity = NULL;
    if (mem_limit && !*mem_limit)
        mem_limit = NULL;
    if (affinity && strcasecmp(affinity, "auto") == 0)
        to_python(); /* NVML utilisation or the registry's view: Python */
    if (handles && strcmp(handles, "per-instance") != 0 && strcmp(handles, "shared") != 0)
        to_python(); /* argparse's own message for a bad choice */
    if (!handles && handles_config_exists())
        to_python();
    char **cmd = argv + i;

    char exe[PATH_MAX];
    find_command(cmd[0], exe, sizeof exe);
    if (needs_python_look(exe))
        to_python();

    /* the shim next to this program, as the Python binding finds it next to itself */
    char self[PATH_MAX], library[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        to_python();
    self[n] = '\0';
    *strrchr(self, '/') = '\0';
    snprintf(library, sizeof library, "%s/libseedance_shim.so", self);
    char near[PATH_MAX]; /* the copy in a wheel's scripts directory: the package's shim */
    if (access(library, F_OK) != 0 && near_self(SD_SHIM_NEAR_SCRIPTS, near, sizeof near) == 0 &&
        realpath(near, library) == NULL)
        to_python();
    const char *override = getenv("SEEDANCE_SHIM_LIB");
    if (override && *override)
        to_python(); /* tests: the Python binding's override and its version check */
    char why[PATH_MAX + 64];
    if (access(library, F_OK) != 0)
        to_python(); /* "the CUDA shim is not built": Python says how to fix it */
    if (unsafe_reason(library, why, sizeof why))
        usage_error("refusing to preload %s: %s, so another user could replace what every wrapped program loads",
                    library, why);

    if (!follow && is_launcher(exe))
        fprintf(stderr, "seedance: note: %s starts other programs, which run unwrapped without --follow-children\n",
                base_name(exe));
    struct stat st;
    if (stat(exe, &st) == 0 && (st.st_mode & (S_ISUID | S_ISGID)))
        fprintf(stderr, "seedance: %s is set-user/group-ID: glibc ignores LD_PRELOAD and LD_AUDIT for it "
                        "(secure-execution mode), so it runs unwrapped\n", exe);
    else if (is_static_elf(exe))
        fprintf(stderr, "seedance: %s is statically linked (no program interpreter): ld.so never runs for it, so "
                        "LD_PRELOAD cannot load the shim and it runs unwrapped\n", exe);
    const char *disable = getenv("SEEDANCE_DISABLE");
    if (disable && strcmp(disable, "1") == 0)
        fprintf(stderr, "seedance: note: SEEDANCE_DISABLE=1 is set in the environment: the shim passes every call "
                        "through%s\n", mem_limit || affinity ? ", so --mem-limit and --affinity are NOT enforced" : "");

    char affinity_value[1024] = "", mem_value[1024] = "";
    if (affinity) {
        resolve_affinity(affinity, affinity_value, sizeof affinity_value);
        check_affinity_devices(affinity, strict);
    }
    if (mem_limit)
        parse_mem_limit(mem_limit, mem_value, sizeof mem_value);

    /* the environment of seedance.shim.wrap_env */
    uint64_t key = 0;
    if (getrandom(&key, sizeof key, 0) != sizeof key)
        key = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL);
    key = (key & ~(1ull << 63)) | 1;
    char text[64];
    env_copy();
    snprintf(text, sizeof text, "%llx", (unsigned long long)key);
    env_set("SEEDANCE_GROUP", text);
    snprintf(text, sizeof text, "%d", (int)getpid());
    env_set("SEEDANCE_GROUP_OWNER", text);
    env_set("SEEDANCE_SHIM_VERSION", SD_VERSION_STRING "+abi" STR(SD_ABI_VERSION));
    env_set_list_front("LD_PRELOAD", library);
    if (audit)
        env_set_list_front("LD_AUDIT", library);
    if (follow)
        env_set("SEEDANCE_FOLLOW", "1");
    else
        env_unset("SEEDANCE_FOLLOW");
    env_unset("SEEDANCE_EVENTS");
    if (affinity_value[0])
        env_set("SEEDANCE_AFFINITY", affinity_value);
    if (mem_value[0])
        env_set("SEEDANCE_MEM_LIMIT", mem_value);
    if (handles && strcmp(handles, "per-instance") == 0)
        env_set("SEEDANCE_HANDLES", "per-instance");
    else
        env_unset("SEEDANCE_HANDLES");

    /* Ctrl-C reaches the program from the terminal (same process group): only wait for
     * it; SIGTERM/SIGHUP sent to seedance are passed on (as the Python command does) */
    struct sigaction ign = {.sa_handler = SIG_IGN}, fwd = {.sa_handler = forward}, old_int;
    sigaction(SIGINT, &ign, &old_int);
    sigaction(SIGTERM, &fwd, NULL);
    sigaction(SIGHUP, &fwd, NULL);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t defaults;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGINT);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    int rc = posix_spawn(&child_pid, exe, NULL, &attr, cmd, child_env);
    if (rc == ENOEXEC) {
        /* no #! line and not ELF: a /bin/sh script, as execvp runs it (posix/execvpe.c
         * maybe_script_execute), and so env(1) and the shells */
        int n = 0;
        while (cmd[n])
            n++;
        char **script = calloc((size_t)n + 2, sizeof *script);
        if (!script)
            cannot_run(EXIT_CANNOT_INVOKE, "%s: %s", cmd[0], strerror(ENOMEM));
        script[0] = (char *)"/bin/sh";
        script[1] = exe;
        for (int k = 1; k < n; k++)
            script[k + 1] = cmd[k];
        rc = posix_spawn(&child_pid, "/bin/sh", NULL, &attr, script, child_env);
        free(script);
    }
    posix_spawnattr_destroy(&attr);
    if (rc != 0) { /* the messages of the Python command: strerror in lower case */
        char reason[128];
        snprintf(reason, sizeof reason, "%s", strerror(rc));
        for (char *p = reason; *p; p++)
            *p = (char)tolower((unsigned char)*p);
        cannot_run(rc == ENOENT ? EXIT_NOT_FOUND : EXIT_CANNOT_INVOKE, "%s: %s", cmd[0], reason);
    }
    int status = 0;
    while (waitpid(child_pid, &status, 0) < 0 && errno == EINTR)
        ;
    int code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);

    if (finish_run(library, key, affinity)) {
        /* memory held at exit: the findings come from the rule engine */
        char key_text[32], code_text[16];
        snprintf(key_text, sizeof key_text, "%llx", (unsigned long long)key);
        snprintf(code_text, sizeof code_text, "%d", code);
        char *args[] = {(char *)"run", (char *)"--finish-group", key_text, (char *)"--exit-code", code_text,
                        (char *)"--affinity", (char *)affinity};
        fflush(stderr);
        exec_cli(args, affinity ? 7 : 5); /* --affinity: for its note on an affinity that named no device */
        fprintf(stderr, "seedance: error: run: cannot start %s for the report: %s\n", SD_PYTHON, strerror(errno));
    }
    return code;
}
