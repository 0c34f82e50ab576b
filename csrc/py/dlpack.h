/* The DLPack ABI (dmlc/dlpack, include/dlpack/dlpack.h, v1.1): the structs a capsule from
 * __dlpack__ points to, restated with the layout and values of the standard header.
 *
 * Capsules: "dltensor" holds a DLManagedTensor (DLPack 0.x, unversioned), "dltensor_versioned" a
 * DLManagedTensorVersioned (DLPack >= 1.0). The consumer renames the capsule to "used_dltensor"
 * ("used_dltensor_versioned") when it takes the tensor and then calls its deleter exactly once;
 * a capsule left unrenamed is freed by the producer's capsule destructor.
 *
 * gputrain's simulated device ("sim:N") has no DLPack device type: its arrays use kDLExtDev
 * ("reserved extension device type, for testing extension devices") with device_id N, and the
 * stream handles of core/device_backend.h's stream_from_native (1: the default stream). */
#ifndef GTPY_DLPACK_H
#define GTPY_DLPACK_H

#include <stdint.h>

enum {
    GTPY_DLPACK_MAJOR = 1,  /* the DLPack major version read and written */
    GTPY_DLPACK_MINOR = 1,  /* the minor version written */
};

typedef enum {
    kDLCPU = 1,
    kDLCUDA = 2,
    kDLCUDAHost = 3,
    kDLExtDev = 12,
    kDLCUDAManaged = 13,
} DLDeviceType;

typedef struct {
    int32_t device_type;  /* a DLDeviceType */
    int32_t device_id;    /* the device ordinal */
} DLDevice;

typedef enum {
    kDLInt = 0,
    kDLUInt = 1,
    kDLFloat = 2,
    kDLBfloat = 4,
    kDLBool = 6,
} DLDataTypeCode;

typedef struct {
    uint8_t code;    /* a DLDataTypeCode */
    uint8_t bits;    /* bits of one lane */
    uint16_t lanes;  /* 1 for scalars */
} DLDataType;

typedef struct {
    void *data;           /* start of the allocation (the tensor starts byte_offset after it) */
    DLDevice device;      /* where `data` lies */
    int32_t ndim;         /* dimensions */
    DLDataType dtype;     /* element type */
    int64_t *shape;       /* (ndim,) */
    int64_t *strides;     /* (ndim,) in elements, or NULL: C-contiguous */
    uint64_t byte_offset; /* bytes from `data` to the first element */
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;                             /* the tensor */
    void *manager_ctx;                              /* the producer's state */
    void (*deleter)(struct DLManagedTensor *self);  /* frees it; may be NULL */
} DLManagedTensor;

typedef struct {
    uint32_t major;  /* ABI version: a consumer reads only the major versions it knows */
    uint32_t minor;  /* backward-compatible additions */
} DLPackVersion;

#define DLPACK_FLAG_BITMASK_READ_ONLY (UINT64_C(1) << 0)
#define DLPACK_FLAG_BITMASK_IS_COPIED (UINT64_C(1) << 1)

typedef struct DLManagedTensorVersioned {
    DLPackVersion version;                                   /* of the producer's ABI */
    void *manager_ctx;                                       /* the producer's state */
    void (*deleter)(struct DLManagedTensorVersioned *self);  /* frees it; may be NULL */
    uint64_t flags;                                          /* DLPACK_FLAG_BITMASK_* */
    DLTensor dl_tensor;                                      /* the tensor */
} DLManagedTensorVersioned;

#endif
