// Opens cuBLAS(Lt), cuDNN and NCCL with dlopen when first needed and fills their tables of
// function pointers (cuda_libs.cuh). Which copy: one already loaded in the process (e.g.
// PyTorch's, found with RTLD_NOLOAD by soname), else the path the resolver gives (the Python
// layer asks NVIDIA's cuda.pathfinder: NVIDIA's wheels in the environment, conda, then the system
// toolkit), else the soname through the system's search. Handles are never closed: a library
// can be in use by other code of the process, and cuDNN and NCCL keep state until exit.
#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "cuda_libs.cuh"

#define GT_STR_(x) #x
#define GT_STR(x) GT_STR_(x)  // expands macros first: cublasCreate -> "cublasCreate_v2"

gt_cublaslt_table gt_cublaslt;
gt_cublas_table gt_cublas;
gt_cudnn_table gt_cudnn;
gt_nccl_table gt_nccl;

namespace {

// Reads symbol `name` of `handle` into *out (a typed function pointer); false when absent.
template <class F>
bool read_symbol(void *handle, const char *name, F *out) {
    void *p = dlsym(handle, name);
    if (!p)
        return false;
    static_assert(sizeof p == sizeof *out, "function and object pointers differ in size");
    memcpy(out, &p, sizeof p);
    return true;
}

// Fills `table` from `handle`; on a missing function, names it in *missing and returns false.
#define GT_CUDA_LIB_READ(name)                           \
    if (!read_symbol(handle, GT_STR(name), &table->name)) { \
        *missing = GT_STR(name);                         \
        return false;                                    \
    }

bool read_cublaslt(void *handle, gt_cublaslt_table *table, const char **missing) {
    GT_CUBLASLT_FUNCTIONS(GT_CUDA_LIB_READ)
    return true;
}
// Unevaluated (no reference to the symbol): the written-out type matches an overload of the header.
static_assert(sizeof(static_cast<gt_pfn_cublasGemmStridedBatchedEx>(&cublasGemmStridedBatchedEx)) > 0,
              "cublasGemmStridedBatchedEx's prototype changed: update gt_pfn_cublasGemmStridedBatchedEx");

bool read_cublas(void *handle, gt_cublas_table *table, const char **missing) {
    GT_CUBLAS_FUNCTIONS(GT_CUDA_LIB_READ)
    GT_CUDA_LIB_READ(cublasGemmStridedBatchedEx)
    return true;
}
bool read_cudnn(void *handle, gt_cudnn_table *table, const char **missing) {
    GT_CUDNN_FUNCTIONS(GT_CUDA_LIB_READ)
    return true;
}
bool read_nccl(void *handle, gt_nccl_table *table, const char **missing) {
    GT_NCCL_FUNCTIONS(GT_CUDA_LIB_READ)
    return true;
}

// Each library's steps: read its table from a handle, then its version (major*10000 +
// minor*100 + patch, the encoding of CUBLAS_VERSION, CUDNN_VERSION and NCCL_VERSION_CODE).
bool open_cublaslt(void *handle, const char **missing, long *version) {
    gt_cublaslt_table t{};
    if (!read_cublaslt(handle, &t, missing))
        return false;
    *version = (long)t.cublasLtGetVersion();
    gt_cublaslt = t;
    return true;
}

bool open_cublas(void *handle, const char **missing, long *version) {
    gt_cublas_table t{};
    if (!read_cublas(handle, &t, missing))
        return false;
    int major = 0, minor = 0, patch = 0;
    t.cublasGetProperty(MAJOR_VERSION, &major);
    t.cublasGetProperty(MINOR_VERSION, &minor);
    t.cublasGetProperty(PATCH_LEVEL, &patch);
    *version = major * 10000L + minor * 100L + patch;
    gt_cublas = t;
    return true;
}

bool open_cudnn(void *handle, const char **missing, long *version) {
    gt_cudnn_table t{};
    if (!read_cudnn(handle, &t, missing))
        return false;
    *version = (long)t.cudnnGetVersion();
    gt_cudnn = t;
    return true;
}

bool open_nccl(void *handle, const char **missing, long *version) {
    gt_nccl_table t{};
    if (!read_nccl(handle, &t, missing))
        return false;
    int v = 0;
    t.ncclGetVersion(&v);
    *version = v;
    gt_nccl = t;
    return true;
}

// One library: what to open, what gputrain accepts, and what was opened.
struct lib_slot {
    const char *name;      // cuda.pathfinder's short name
    const char *title;     // as the user knows it, for messages
    const char *soname;    // file name opened by soname
    const char *used_for;  // what needs it, for messages
    const char *wheel;     // the registry wheel that ships it, for messages
    long min_version;      // oldest accepted (same encoding as `version`)
    long end_version;      // first version not accepted (the next major)
    long built_with;       // the headers' version
    bool (*open)(void *handle, const char **missing, long *version);  // fills the table
    std::mutex lock;                // serialises loading; the fields below are written under it
    std::atomic<int> loaded{0};     // 1 once the table, path and version are valid
    char path[4096];                // the file the dynamic loader mapped
    long version;                   // the library's version
};

#define GT_CUDA_MAJOR_TEXT GT_STR(CUBLAS_VER_MAJOR)

lib_slot slots[GT_CUDA_LIB_COUNT] = {
    {"cublasLt", "cuBLASLt", "libcublasLt.so." GT_CUDA_MAJOR_TEXT, "the CUDA backend's GEMMs",
     "nvidia-cublas", CUBLAS_VER_MAJOR * 10000L, (CUBLAS_VER_MAJOR + 1) * 10000L, CUBLAS_VERSION, open_cublaslt},
    {"cublas", "cuBLAS", "libcublas.so." GT_CUDA_MAJOR_TEXT, "the CUDA backend's GEMMs", "nvidia-cublas",
     CUBLAS_VER_MAJOR * 10000L, (CUBLAS_VER_MAJOR + 1) * 10000L, CUBLAS_VERSION, open_cublas},
    {"cudnn", "cuDNN", "libcudnn.so." GT_STR(CUDNN_MAJOR), "Conv2d on CUDA", "nvidia-cudnn-cu" GT_CUDA_MAJOR_TEXT,
     CUDNN_MAJOR * 10000L, (CUDNN_MAJOR + 1) * 10000L, CUDNN_VERSION, open_cudnn},
    {"nccl", "NCCL", "libnccl.so." GT_STR(NCCL_MAJOR), "collectives between CUDA devices",
     "nvidia-nccl-cu" GT_CUDA_MAJOR_TEXT, NCCL_VERSION(2, 27, 0), (NCCL_MAJOR + 1) * 10000L, NCCL_VERSION_CODE,
     open_nccl},
};

std::atomic<gt_cuda_lib_resolver> resolver{nullptr};

// "9.19.0" from 91900.
void version_text(long v, char *out, size_t size) {
    snprintf(out, size, "%ld.%ld.%ld", v / 10000, v / 100 % 100, v % 100);
}

// The file `handle` maps (its link map name), into slot->path.
void record_path(lib_slot *slot, void *handle) {
    struct link_map *map = nullptr;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name)
        snprintf(slot->path, sizeof slot->path, "%s", map->l_name);
    else
        snprintf(slot->path, sizeof slot->path, "%s", slot->soname);
}

// Opens the copy to use; on failure says what was tried in `tried`.
void *open_copy(lib_slot *slot, const char *path, const char *why, char *tried, size_t size) {
    void *handle = nullptr;
    const char *path_error = why;
    if (path[0]) {
        handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (handle)
            return handle;
        path_error = dlerror();
    }
    handle = dlopen(slot->soname, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char *soname_error = dlerror();
        snprintf(tried, size, "%s%s%s; by soname: %s", path[0] ? path : "", path[0] ? ": " : "",
                 path_error && path_error[0] ? path_error : "no copy found", soname_error ? soname_error : "?");
    }
    return handle;
}

// Reads the table and checks the version of the library `handle` maps.
gt_status adopt(lib_slot *slot, void *handle) {
    record_path(slot, handle);
    const char *missing = "";
    long version = 0;
    if (!slot->open(handle, &missing, &version))
        return GT_FAIL(GT_ERR_CUDA, "%s at %s has no function %s: it is not the %s gputrain was built for",
                       slot->title, slot->path, missing, slot->soname);
    if (version < slot->min_version || version >= slot->end_version) {
        char found[32], least[32], built[32];
        version_text(version, found, sizeof found);
        version_text(slot->min_version, least, sizeof least);
        version_text(slot->built_with, built, sizeof built);
        return GT_FAIL(GT_ERR_CUDA, "%s %s at %s cannot be used: gputrain needs %s >= %s and < %ld (built with %s); "
                       "install a matching one (pip install %s)", slot->title, found, slot->path, slot->title,
                       least, slot->end_version / 10000, built, slot->wheel);
    }
    slot->version = version;
    return GT_OK;
}

gt_status load_slot(lib_slot *slot) {
    if (slot->loaded.load(std::memory_order_acquire))
        return GT_OK;
    char path[4096] = "", why[1024] = "";
    void *handle = dlopen(slot->soname, RTLD_NOW | RTLD_NOLOAD);  // a copy already in the process
    gt_cuda_lib_resolver resolve = resolver.load();
    if (!handle && resolve && resolve(slot->name, slot->soname, path, sizeof path, why, sizeof why) != 0)
        path[0] = '\0';
    std::lock_guard<std::mutex> guard(slot->lock);
    if (slot->loaded.load(std::memory_order_acquire))
        return GT_OK;
    char tried[6144] = "";
    if (!handle)
        handle = open_copy(slot, path, why, tried, sizeof tried);
    if (!handle)
        return GT_FAIL(GT_ERR_CUDA, "cannot load %s (%s), which %s needs: %s. Install it (pip install %s) or put "
                       "your CUDA toolkit's copy on the library path", slot->title, slot->soname, slot->used_for,
                       tried, slot->wheel);
    GT_TRY(adopt(slot, handle));
    slot->loaded.store(1, std::memory_order_release);
    return GT_OK;
}

}  // namespace

extern "C" void gt_cuda_set_lib_resolver(gt_cuda_lib_resolver r) { resolver.store(r); }

extern "C" gt_status gt_cuda_lib_load(gt_cuda_lib lib) {
    if ((int)lib < 0 || lib >= GT_CUDA_LIB_COUNT)
        return GT_FAIL(GT_ERR_VALUE, "lib: unknown CUDA library %d", (int)lib);
    if (lib == GT_CUDA_LIB_CUBLAS)  // libcublas needs libcublasLt: the same choice for both
        GT_TRY(gt_cuda_lib_load(GT_CUDA_LIB_CUBLASLT));
    return load_slot(&slots[lib]);
}

extern "C" gt_status gt_cuda_lib_get_info(gt_cuda_lib lib, gt_cuda_lib_info *out) {
    if ((int)lib < 0 || lib >= GT_CUDA_LIB_COUNT)
        return GT_FAIL(GT_ERR_VALUE, "lib: unknown CUDA library %d", (int)lib);
    lib_slot *slot = &slots[lib];
    int loaded = slot->loaded.load(std::memory_order_acquire);
    *out = gt_cuda_lib_info{slot->name, slot->soname, loaded, loaded ? slot->path : "",
                            loaded ? slot->version : 0, slot->min_version, slot->built_with};
    return GT_OK;
}
