/*
 * sdtest.c: a CUDA driver API client for the shim tests, built two ways:
 *   -DLINKED: linked against libcuda.so.1 (-lcuda); `--via direct` uses the link-time
 *             symbols, `--via procaddr` fetches everything through cuGetProcAddress_v2
 *             as libcudart >= 11.3 does.
 *   plain:    dlopen("libcuda.so.1") + dlsym for every entry point (`--via dlsym`).
 * Steps run in order; each prints one "name key=value ..." line to stdout.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#undef cuGetProcAddress

static struct {
    CUresult (*Init)(unsigned int);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetUuid)(CUuuid *, CUdevice);
    CUresult (*DeviceGetPCIBusId)(char *, int, CUdevice);
    CUresult (*DeviceGetByPCIBusId)(CUdevice *, const char *);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxGetDevice)(CUdevice *);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemAllocManaged)(CUdeviceptr *, size_t, unsigned int);
    CUresult (*MemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
    CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle);
    CUresult (*MemGetInfo)(size_t *, size_t *);
} cu;

static CUcontext ctx;
static CUdeviceptr ptrs[4096];
static int nptrs;

typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void *via_procaddr(gpa_t gpa, const char *name, int version)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult status = 99;
    CUresult r = gpa(name, &fn, version, 0, &status);
    if (r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS) {
        fprintf(stderr, "cuGetProcAddress_v2(%s, %d) = %d status %d\n", name, version, r, status);
        exit(3);
    }
    return fn;
}

static void bind(const char *via)
{
    if (strcmp(via, "dlsym") == 0) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            exit(3);
        }
#define SYM(field, name) *(void **)&cu.field = dlsym(h, name)
        SYM(Init, "cuInit"); SYM(DeviceGetCount, "cuDeviceGetCount"); SYM(DeviceGet, "cuDeviceGet");
        SYM(DeviceGetUuid, "cuDeviceGetUuid_v2"); SYM(DeviceGetPCIBusId, "cuDeviceGetPCIBusId");
        SYM(DeviceGetByPCIBusId, "cuDeviceGetByPCIBusId"); SYM(DeviceTotalMem, "cuDeviceTotalMem_v2");
        SYM(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain"); SYM(CtxSetCurrent, "cuCtxSetCurrent");
        SYM(CtxGetDevice, "cuCtxGetDevice"); SYM(MemAlloc, "cuMemAlloc_v2"); SYM(MemFree, "cuMemFree_v2");
        SYM(MemAllocManaged, "cuMemAllocManaged"); SYM(MemAllocPitch, "cuMemAllocPitch_v2");
        SYM(MemAllocAsync, "cuMemAllocAsync"); SYM(MemFreeAsync, "cuMemFreeAsync");
        SYM(MemCreate, "cuMemCreate"); SYM(MemRelease, "cuMemRelease"); SYM(MemGetInfo, "cuMemGetInfo_v2");
        return;
    }
#ifdef LINKED
    if (strcmp(via, "direct") == 0) {
        cu.Init = cuInit; cu.DeviceGetCount = cuDeviceGetCount; cu.DeviceGet = cuDeviceGet;
        cu.DeviceGetUuid = cuDeviceGetUuid_v2; cu.DeviceGetPCIBusId = cuDeviceGetPCIBusId;
        cu.DeviceGetByPCIBusId = cuDeviceGetByPCIBusId; cu.DeviceTotalMem = cuDeviceTotalMem_v2;
        cu.PrimaryCtxRetain = cuDevicePrimaryCtxRetain; cu.CtxSetCurrent = cuCtxSetCurrent;
        cu.CtxGetDevice = cuCtxGetDevice; cu.MemAlloc = cuMemAlloc_v2; cu.MemFree = cuMemFree_v2;
        cu.MemAllocManaged = cuMemAllocManaged; cu.MemAllocPitch = cuMemAllocPitch_v2;
        cu.MemAllocAsync = cuMemAllocAsync; cu.MemFreeAsync = cuMemFreeAsync;
        cu.MemCreate = cuMemCreate; cu.MemRelease = cuMemRelease; cu.MemGetInfo = cuMemGetInfo_v2;
        return;
    }
    if (strcmp(via, "procaddr") == 0) {
        /* what libcudart does: everything through cuGetProcAddress, before cuInit */
        gpa_t gpa = (gpa_t)via_procaddr(cuGetProcAddress_v2, "cuGetProcAddress", 12000);
#define PA(field, name) *(void **)&cu.field = via_procaddr(gpa, name, 12080)
        PA(Init, "cuInit"); PA(DeviceGetCount, "cuDeviceGetCount"); PA(DeviceGet, "cuDeviceGet");
        PA(DeviceGetUuid, "cuDeviceGetUuid"); PA(DeviceGetPCIBusId, "cuDeviceGetPCIBusId");
        PA(DeviceGetByPCIBusId, "cuDeviceGetByPCIBusId"); PA(DeviceTotalMem, "cuDeviceTotalMem");
        PA(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain"); PA(CtxSetCurrent, "cuCtxSetCurrent");
        PA(CtxGetDevice, "cuCtxGetDevice"); PA(MemAlloc, "cuMemAlloc"); PA(MemFree, "cuMemFree");
        PA(MemAllocManaged, "cuMemAllocManaged"); PA(MemAllocPitch, "cuMemAllocPitch");
        PA(MemAllocAsync, "cuMemAllocAsync"); PA(MemFreeAsync, "cuMemFreeAsync");
        PA(MemCreate, "cuMemCreate"); PA(MemRelease, "cuMemRelease"); PA(MemGetInfo, "cuMemGetInfo");
        return;
    }
#endif
    fprintf(stderr, "unknown --via %s\n", via);
    exit(2);
}

struct worker {
    int iters;
    size_t bytes;
    int hold;          /* blocks held at once per iteration */
    int ok, oom, other;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    cu.CtxSetCurrent(ctx);
    CUdeviceptr held[64];
    for (int i = 0; i < w->iters; i++) {
        int n = 0;
        for (int k = 0; k < w->hold && k < 64; k++) {
            CUresult r = cu.MemAlloc(&held[n], w->bytes);
            if (r == CUDA_SUCCESS) {
                w->ok++;
                n++;
            } else if (r == CUDA_ERROR_OUT_OF_MEMORY) {
                w->oom++;
            } else {
                w->other++;
            }
        }
        for (int k = 0; k < n; k++)
            if (cu.MemFree(held[k]) != CUDA_SUCCESS)
                w->other++;
    }
    return NULL;
}

static void step(const char *s);

int main(int argc, char **argv)
{
    const char *via = "direct";
    int i = 1;
    if (argc > 2 && strcmp(argv[1], "--via") == 0) {
        via = argv[2];
        i = 3;
    }
    bind(via);
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (; i < argc; i++)
        step(argv[i]);
    return 0;
}

static void step(const char *s)
{
    CUresult r;
    if (strcmp(s, "init") == 0) {
        printf("init result=%d\n", cu.Init(0));
    } else if (strcmp(s, "count") == 0) {
        int n = -1;
        r = cu.DeviceGetCount(&n);
        printf("count result=%d count=%d\n", r, n);
    } else if (strncmp(s, "uuid:", 5) == 0) {
        CUdevice d;
        CUuuid u;
        r = cu.DeviceGet(&d, atoi(s + 5));
        if (r == CUDA_SUCCESS)
            r = cu.DeviceGetUuid(&u, d);
        char bus[64] = "";
        if (r == CUDA_SUCCESS)
            cu.DeviceGetPCIBusId(bus, sizeof bus, d);
        printf("uuid result=%d last=%d bus=%s\n", r, r == CUDA_SUCCESS ? (unsigned char)u.bytes[15] : -1, bus);
    } else if (strncmp(s, "pci:", 4) == 0) {
        CUdevice d = -1;
        r = cu.DeviceGetByPCIBusId(&d, s + 4);
        printf("pci result=%d device=%d\n", r, d);
    } else if (strncmp(s, "ctx:", 4) == 0) {
        CUdevice d;
        r = cu.DeviceGet(&d, atoi(s + 4));
        if (r == CUDA_SUCCESS)
            r = cu.PrimaryCtxRetain(&ctx, d);
        if (r == CUDA_SUCCESS)
            r = cu.CtxSetCurrent(ctx);
        printf("ctx result=%d\n", r);
    } else if (strncmp(s, "ownctx:", 7) == 0) {
        /* Two retains must give one context; only a non-primary context can be destroyed
         * (the driver answers CUDA_ERROR_INVALID_CONTEXT for a primary one). */
        CUdevice d;
        CUcontext a = NULL, b = NULL;
        CUresult (*destroy)(CUcontext) = NULL;
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (h)
            *(void **)&destroy = dlsym(h, "cuCtxDestroy_v2");
        r = cu.DeviceGet(&d, atoi(s + 7));
        if (r == CUDA_SUCCESS)
            r = cu.PrimaryCtxRetain(&a, d);
        if (r == CUDA_SUCCESS)
            r = cu.PrimaryCtxRetain(&b, d);
        int destroyed = (r == CUDA_SUCCESS && destroy) ? destroy(a) : -1;
        printf("ownctx result=%d same=%d destroy=%d\n", r, a == b, destroyed);
    } else if (strncmp(s, "ctxraw:", 7) == 0) { /* a CUdevice handle the program made up */
        r = cu.PrimaryCtxRetain(&ctx, atoi(s + 7));
        printf("ctxraw result=%d\n", r);
    } else if (strncmp(s, "alloc:", 6) == 0) {
        CUdeviceptr p = 0;
        r = cu.MemAlloc(&p, strtoull(s + 6, NULL, 10));
        if (r == CUDA_SUCCESS && nptrs < 4096)
            ptrs[nptrs++] = p;
        printf("alloc result=%d\n", r);
    } else if (strncmp(s, "managed:", 8) == 0) {
        CUdeviceptr p = 0;
        r = cu.MemAllocManaged(&p, strtoull(s + 8, NULL, 10), 1);
        if (r == CUDA_SUCCESS && nptrs < 4096)
            ptrs[nptrs++] = p;
        printf("managed result=%d\n", r);
    } else if (strncmp(s, "async:", 6) == 0) {
        CUdeviceptr p = 0;
        r = cu.MemAllocAsync(&p, strtoull(s + 6, NULL, 10), NULL);
        if (r == CUDA_SUCCESS)
            r = cu.MemFreeAsync(p, NULL);
        printf("async result=%d\n", r);
    } else if (strncmp(s, "pitch:", 6) == 0) {
        CUdeviceptr p = 0;
        size_t pitch = 0, w = strtoull(s + 6, NULL, 10), h = 4;
        r = cu.MemAllocPitch(&p, &pitch, w, h, 4);
        if (r == CUDA_SUCCESS && nptrs < 4096)
            ptrs[nptrs++] = p;
        printf("pitch result=%d pitch=%zu\n", r, pitch);
    } else if (strncmp(s, "vmm:", 4) == 0) { /* vmm:<device ordinal>:<bytes>, created then released */
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = atoi(s + 4);
        CUmemGenericAllocationHandle h = 0;
        r = cu.MemCreate(&h, strtoull(strchr(s + 4, ':') + 1, NULL, 10), &prop, 0);
        CUresult r2 = r == CUDA_SUCCESS ? cu.MemRelease(h) : -1;
        printf("vmm result=%d release=%d\n", r, r2);
    } else if (strncmp(s, "vmmhost:", 8) == 0) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
        CUmemGenericAllocationHandle h = 0;
        r = cu.MemCreate(&h, strtoull(s + 8, NULL, 10), &prop, 0);
        CUresult r2 = r == CUDA_SUCCESS ? cu.MemRelease(h) : -1;
        printf("vmmhost result=%d release=%d\n", r, r2);
    } else if (strcmp(s, "free:all") == 0) {
        int bad = 0;
        for (int k = 0; k < nptrs; k++)
            bad += cu.MemFree(ptrs[k]) != CUDA_SUCCESS;
        printf("free freed=%d bad=%d\n", nptrs, bad);
        nptrs = 0;
    } else if (strcmp(s, "meminfo") == 0) {
        size_t f = 0, t = 0;
        r = cu.MemGetInfo(&f, &t);
        printf("meminfo result=%d free=%zu total=%zu\n", r, f, t);
    } else if (strncmp(s, "totalmem:", 9) == 0) {
        CUdevice d;
        size_t t = 0;
        r = cu.DeviceGet(&d, atoi(s + 9));
        if (r == CUDA_SUCCESS)
            r = cu.DeviceTotalMem(&t, d);
        printf("totalmem result=%d total=%zu\n", r, t);
    } else if (strncmp(s, "threads:", 8) == 0) { /* threads:<n>:<iters>:<bytes>[:<hold>] */
        int n = atoi(s + 8);
        const char *p = strchr(s + 8, ':');
        int iters = atoi(p + 1);
        const char *b = strchr(p + 1, ':') + 1;
        size_t bytes = strtoull(b, NULL, 10);
        int hold = strchr(b, ':') ? atoi(strchr(b, ':') + 1) : 1;
        pthread_t tid[256];
        struct worker w[256];
        for (int k = 0; k < n && k < 256; k++) {
            w[k] = (struct worker){iters, bytes, hold, 0, 0, 0};
            pthread_create(&tid[k], NULL, worker_main, &w[k]);
        }
        int ok = 0, oom = 0, other = 0;
        for (int k = 0; k < n && k < 256; k++) {
            pthread_join(tid[k], NULL);
            ok += w[k].ok;
            oom += w[k].oom;
            other += w[k].other;
        }
        printf("threads ok=%d oom=%d other=%d\n", ok, oom, other);
    } else if (strncmp(s, "fork:", 5) == 0) { /* fork:<bytes>: the child allocates and exits */
        pid_t pid = fork();
        if (pid == 0) {
            CUdeviceptr p;
            CUresult rc = cu.MemAlloc(&p, strtoull(s + 5, NULL, 10));
            printf("child result=%d\n", rc);
            exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        printf("fork status=%d\n", WEXITSTATUS(status));
    } else if (strncmp(s, "procs:", 6) == 0) { /* procs:<n>:<threads>:<iters>:<bytes>[:<hold>]: forked workers */
        int n = atoi(s + 6);
        char rest[128];
        snprintf(rest, sizeof rest, "threads:%s", strchr(s + 6, ':') + 1);
        pid_t kids[64];
        for (int k = 0; k < n && k < 64; k++) {
            kids[k] = fork();
            if (kids[k] == 0) {
                step("init");
                step("ctx:0");
                step(rest);
                exit(0);
            }
        }
        int failed = 0;
        for (int k = 0; k < n && k < 64; k++) {
            int status = 0;
            waitpid(kids[k], &status, 0);
            failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        }
        printf("procs failed=%d\n", failed);
#ifdef LINKED
    } else if (strncmp(s, "gpa:", 4) == 0) { /* gpa:<symbol>:<cudaVersion>:<flags>: who answers */
        char name[128];
        int version = 0, flags = 0;
        sscanf(s + 4, "%127[^:]:%d:%d", name, &version, &flags);
        void *fn = NULL;
        CUdriverProcAddressQueryResult status = 99;
        r = cuGetProcAddress_v2(name, &fn, version, (cuuint64_t)flags, &status);
        Dl_info info;
        const char *lib = fn && dladdr(fn, &info) && info.dli_fname ? strrchr(info.dli_fname, '/') : NULL;
        printf("gpa result=%d status=%d lib=%s sym=%s\n", r, status, lib ? lib + 1 : "-",
               fn && dladdr(fn, &info) && info.dli_sname ? info.dli_sname : "-");
#endif
    } else if (strncmp(s, "setenv:", 7) == 0) { /* setenv:NAME=VALUE: the program changes its env */
        char name[128];
        const char *eq = strchr(s + 7, '=');
        snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - (s + 7)) : 0, s + 7);
        printf("setenv result=%d\n", eq ? setenv(name, eq + 1, 1) : -1);
    } else if (strncmp(s, "unsetenv:", 9) == 0) {
        printf("unsetenv result=%d\n", unsetenv(s + 9));
    } else if (strcmp(s, "stdout") == 0) {
        printf("stdout marker\n");
    } else if (strncmp(s, "sleep:", 6) == 0) {
        usleep((useconds_t)atoi(s + 6) * 1000);
    } else if (strcmp(s, "kill") == 0) {
        fflush(stdout);
        raise(SIGKILL);
    } else {
        fprintf(stderr, "unknown step %s\n", s);
        exit(2);
    }
}
