// fmha._C: the params structs of fmha.h as Python objects, and the entry points.  Pointers
// and streams travel as Python ints; no torch header is included, so one build serves every
// torch release.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "fmha/fmha.h"

namespace py = pybind11;

namespace {

void check(fmha_status status) {
  if (status == FMHA_SUCCESS) return;
  const std::string msg = fmha_last_error();
  switch (status) {
    case FMHA_ERROR_INVALID_VALUE: throw py::value_error(msg);
    default: throw std::runtime_error(msg);
  }
}

template <class T>
uintptr_t addr(T* p) {
  return reinterpret_cast<uintptr_t>(p);
}

void* as_ptr(uintptr_t a) { return reinterpret_cast<void*>(a); }

// A tensor as the Python side passes it: (data, batch_stride, row_stride, head_stride).
using TensorArg = std::tuple<uintptr_t, int64_t, int64_t, int64_t>;
using OptionalTensorArg = std::optional<TensorArg>;

fmha_tensor as_tensor(const TensorArg& t) {
  return fmha_tensor{as_ptr(std::get<0>(t)), std::get<1>(t), std::get<2>(t), std::get<3>(t)};
}
fmha_tensor as_tensor(const OptionalTensorArg& t) { return t ? as_tensor(*t) : fmha_tensor{}; }

// An fp8 input's dequantization factors as the Python side passes them: (data,
// batch_stride, head_stride), float32 in device memory; None means 1 (fmha_descale).
using DescaleArg = std::optional<std::tuple<uintptr_t, int64_t, int64_t>>;

fmha_descale as_descale(const DescaleArg& d) {
  if (!d) return fmha_descale{};
  return fmha_descale{static_cast<const float*>(as_ptr(std::get<0>(*d))), std::get<1>(*d), std::get<2>(*d)};
}

// A workspace of fmha_*_workspace_size() bytes from `alloc(bytes)`, a Python callable returning an
// object with a data_ptr() (a torch tensor, so torch's caching allocator serves it); called only
// when the call needs one.  The object is returned so the caller holds it until the kernels are
// enqueued.
template <class Params>
py::object attach_workspace(Params& p, size_t bytes, const py::object& alloc) {
  py::object workspace;
  if (bytes > 0) {
    workspace = alloc(bytes);
    p.workspace = as_ptr(workspace.attr("data_ptr")().cast<uintptr_t>());
    p.workspace_size = bytes;
  }
  return workspace;
}

// Exposes a pointer member as a read/write int property.
#define FMHA_PTR_PROPERTY(cls, Struct, field, Type)                                         \
  cls.def_property(                                                                          \
      #field, [](const Struct& s) { return addr(s.field); },                                 \
      [](Struct& s, uintptr_t a) { s.field = static_cast<Type>(as_ptr(a)); })

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "libfmha bindings: params structs and entry points (see fmha/fmha.h)";

  py::enum_<fmha_dtype>(m, "DType")
      .value("float32", FMHA_DTYPE_FLOAT32)
      .value("float16", FMHA_DTYPE_FLOAT16)
      .value("bfloat16", FMHA_DTYPE_BFLOAT16)
      .value("float8_e4m3", FMHA_DTYPE_FLOAT8_E4M3)
      .value("int8", FMHA_DTYPE_INT8);
  py::enum_<fmha_device>(m, "Device")
      .value("cpu", FMHA_DEVICE_CPU)
      .value("cuda", FMHA_DEVICE_CUDA)
      .value("hip", FMHA_DEVICE_HIP);
  py::enum_<fmha_cache_scaling>(m, "CacheScaling")
      .value("none", FMHA_SCALE_NONE)
      .value("per_head", FMHA_SCALE_PER_HEAD)
      .value("per_token", FMHA_SCALE_PER_TOKEN);
  py::enum_<fmha_mask_align>(m, "MaskAlign")
      .value("bottom_right", FMHA_ALIGN_BOTTOM_RIGHT)
      .value("top_left", FMHA_ALIGN_TOP_LEFT);

  py::class_<fmha_tensor> tensor(m, "Tensor");
  tensor
      .def(py::init([](uintptr_t data, int64_t batch_stride, int64_t row_stride, int64_t head_stride) {
             return fmha_tensor{as_ptr(data), batch_stride, row_stride, head_stride};
           }),
           py::arg("data") = 0, py::arg("batch_stride") = 0, py::arg("row_stride") = 0,
           py::arg("head_stride") = 0)
      .def_readwrite("batch_stride", &fmha_tensor::batch_stride)
      .def_readwrite("row_stride", &fmha_tensor::row_stride)
      .def_readwrite("head_stride", &fmha_tensor::head_stride);
  FMHA_PTR_PROPERTY(tensor, fmha_tensor, data, void*);

  // A Problem is built in one call, all fields positional (fmha_problem's order): a small
  // call's host time is dominated by per-field Python calls, and the backward reuses the
  // forward's Problem as is.
  py::class_<fmha_problem> problem(m, "Problem");
  problem.def(py::init([](fmha_dtype dtype, int32_t batch, int32_t seqlen_q, int32_t seqlen_k, int32_t total_q,
                          int32_t total_k, int32_t num_heads_q, int32_t num_heads_k, int32_t head_dim,
                          uintptr_t cu_seqlens_q, uintptr_t cu_seqlens_k, uintptr_t seqused_k, float scale,
                          float softcap, int32_t window_left, int32_t window_right, fmha_mask_align mask_align,
                          uintptr_t alibi_slopes, int64_t alibi_batch_stride, float dropout_p, uint64_t seed,
                          uint64_t offset) {
    fmha_fwd_params p;
    fmha_fwd_params_init(&p);
    fmha_problem& pr = p.problem;
    pr.dtype = dtype;
    pr.batch = batch;
    pr.seqlen_q = seqlen_q;
    pr.seqlen_k = seqlen_k;
    pr.total_q = total_q;
    pr.total_k = total_k;
    pr.num_heads_q = num_heads_q;
    pr.num_heads_k = num_heads_k;
    pr.head_dim = head_dim;
    pr.cu_seqlens_q = static_cast<const int32_t*>(as_ptr(cu_seqlens_q));
    pr.cu_seqlens_k = static_cast<const int32_t*>(as_ptr(cu_seqlens_k));
    pr.seqused_k = static_cast<const int32_t*>(as_ptr(seqused_k));
    pr.scale = scale;
    pr.softcap = softcap;
    pr.window_left = window_left;
    pr.window_right = window_right;
    pr.mask_align = mask_align;
    pr.alibi_slopes = static_cast<const float*>(as_ptr(alibi_slopes));
    pr.alibi_batch_stride = alibi_batch_stride;
    pr.dropout_p = dropout_p;
    pr.seed = seed;
    pr.offset = offset;
    return pr;
  }));
#define FMHA_FIELD(name) problem.def_readonly(#name, &fmha_problem::name)
  FMHA_FIELD(dtype);
  FMHA_FIELD(batch);
  FMHA_FIELD(seqlen_q);
  FMHA_FIELD(seqlen_k);
  FMHA_FIELD(total_q);
  FMHA_FIELD(total_k);
  FMHA_FIELD(num_heads_q);
  FMHA_FIELD(num_heads_k);
  FMHA_FIELD(head_dim);
  FMHA_FIELD(scale);
  FMHA_FIELD(softcap);
  FMHA_FIELD(window_left);
  FMHA_FIELD(window_right);
  FMHA_FIELD(mask_align);
  FMHA_FIELD(dropout_p);
  FMHA_FIELD(seed);
  FMHA_FIELD(offset);
#undef FMHA_FIELD

  py::class_<fmha_decode_params> dec(m, "DecodeParams");
  dec.def(py::init([] {
    fmha_decode_params p;
    fmha_decode_params_init(&p);
    return p;
  }));
#define FMHA_DFIELD(name) dec.def_readwrite(#name, &fmha_decode_params::name)
  FMHA_DFIELD(device);
  FMHA_DFIELD(dtype);
  FMHA_DFIELD(batch);
  FMHA_DFIELD(seqlen_q);
  FMHA_DFIELD(num_heads_q);
  FMHA_DFIELD(num_heads_k);
  FMHA_DFIELD(head_dim);
  FMHA_DFIELD(q);
  FMHA_DFIELD(out);
  FMHA_DFIELD(cache_dtype);
  FMHA_DFIELD(k_cache);
  FMHA_DFIELD(v_cache);
  FMHA_DFIELD(cache_batch);
  FMHA_DFIELD(cache_seqlen);
  FMHA_DFIELD(block_table_stride);
  FMHA_DFIELD(max_pages);
  FMHA_DFIELD(scaling);
  FMHA_DFIELD(k_new);
  FMHA_DFIELD(v_new);
  FMHA_DFIELD(seqlen_new);
  FMHA_DFIELD(rotary_dim);
  FMHA_DFIELD(seqlen_ro);
  FMHA_DFIELD(rotary_interleaved);
  FMHA_DFIELD(scale);
  FMHA_DFIELD(softcap);
  FMHA_DFIELD(window_left);
  FMHA_DFIELD(window_right);
  FMHA_DFIELD(alibi_batch_stride);
  FMHA_DFIELD(num_splits);
  FMHA_DFIELD(workspace_size);
  FMHA_DFIELD(total_q);
#undef FMHA_DFIELD
  FMHA_PTR_PROPERTY(dec, fmha_decode_params, lse, float*);
  FMHA_PTR_PROPERTY(dec, fmha_decode_params, block_table, const int32_t*);
  FMHA_PTR_PROPERTY(dec, fmha_decode_params, cache_seqlens, const int32_t*);
  FMHA_PTR_PROPERTY(dec, fmha_decode_params, cache_batch_idx, const int32_t*);
  FMHA_PTR_PROPERTY(dec, fmha_decode_params, cache_leftpad, const int32_t*);
  FMHA_PTR_PROPERTY(dec, fmha_decode_params, k_scale, float*);
  FMHA_PTR_PROPERTY(dec, fmha_decode_params, v_scale, float*);
  FMHA_PTR_PROPERTY(dec, fmha_decode_params, rotary_cos, const void*);
  FMHA_PTR_PROPERTY(dec, fmha_decode_params, rotary_sin, const void*);
  FMHA_PTR_PROPERTY(dec, fmha_decode_params, alibi_slopes, const float*);
  FMHA_PTR_PROPERTY(dec, fmha_decode_params, workspace, void*);
  FMHA_PTR_PROPERTY(dec, fmha_decode_params, cu_seqlens_q, const int32_t*);

  m.def(
      "decode", [](const fmha_decode_params& p, uintptr_t stream) { check(fmha_decode(&p, as_ptr(stream))); },
      py::arg("params"), py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>());
  m.def(
      "decode_workspace_size",
      [](const fmha_decode_params& p) {
        size_t bytes = 0;
        check(fmha_decode_workspace_size(&p, &bytes));
        return bytes;
      },
      py::arg("params"));
  // The forward and backward take their tensors as (data, batch_stride, row_stride,
  // head_stride) tuples (None: absent) and build the params struct here, in one call.  The
  // workspace of either comes from `alloc` (attach_workspace): the backward's always, the
  // forward's (the fp8 forward's; 0 bytes for every other dtype) when `alloc` is given, so a
  // 16-bit forward pays for no workspace query.  The fp8 forward's descales are keywords.
  m.def(
      "fwd",
      [](fmha_device device, uintptr_t stream, const fmha_problem& problem, const TensorArg& q, const TensorArg& k,
         const TensorArg& v, const TensorArg& out, uintptr_t lse, const OptionalTensorArg& probs,
         const DescaleArg& q_descale, const DescaleArg& k_descale, const DescaleArg& v_descale,
         const py::object& alloc) {
        fmha_fwd_params p;
        fmha_fwd_params_init(&p);
        p.device = device;
        p.problem = problem;
        p.q = as_tensor(q), p.k = as_tensor(k), p.v = as_tensor(v), p.out = as_tensor(out);
        p.lse = static_cast<float*>(as_ptr(lse));
        p.probs = as_tensor(probs);
        p.q_descale = as_descale(q_descale), p.k_descale = as_descale(k_descale), p.v_descale = as_descale(v_descale);
        py::object workspace;
        if (!alloc.is_none()) {
          size_t bytes = 0;
          check(fmha_fwd_workspace_size(&p, &bytes));
          workspace = attach_workspace(p, bytes, alloc);
        }
        py::gil_scoped_release release;
        check(fmha_fwd(&p, as_ptr(stream)));
      },
      py::arg("device"), py::arg("stream"), py::arg("problem"), py::arg("q"), py::arg("k"), py::arg("v"),
      py::arg("out"), py::arg("lse"), py::arg("probs"), py::kw_only(), py::arg("q_descale") = py::none(),
      py::arg("k_descale") = py::none(), py::arg("v_descale") = py::none(), py::arg("alloc") = py::none());
  m.def(
      "bwd",
      [](fmha_device device, uintptr_t stream, const fmha_problem& problem, const TensorArg& q, const TensorArg& k,
         const TensorArg& v, const TensorArg& out, const TensorArg& dout, const TensorArg& dq, const TensorArg& dk,
         const TensorArg& dv, uintptr_t lse, uintptr_t dlse, bool deterministic, const py::object& alloc) {
        fmha_bwd_params p;
        fmha_bwd_params_init(&p);
        p.device = device;
        p.problem = problem;
        p.q = as_tensor(q), p.k = as_tensor(k), p.v = as_tensor(v), p.out = as_tensor(out), p.dout = as_tensor(dout);
        p.dq = as_tensor(dq), p.dk = as_tensor(dk), p.dv = as_tensor(dv);
        p.lse = static_cast<const float*>(as_ptr(lse));
        p.dlse = static_cast<const float*>(as_ptr(dlse));
        p.deterministic = deterministic ? 1 : 0;
        size_t bytes = 0;
        check(fmha_bwd_workspace_size(&p, &bytes));
        py::object workspace = attach_workspace(p, bytes, alloc);
        py::gil_scoped_release release;
        check(fmha_bwd(&p, as_ptr(stream)));
      },
      py::arg("device"), py::arg("stream"), py::arg("problem"), py::arg("q"), py::arg("k"), py::arg("v"),
      py::arg("out"), py::arg("dout"), py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("lse"), py::arg("dlse"),
      py::arg("deterministic"), py::arg("alloc"));
  m.def(
      "capabilities",
      [](fmha_device device) {
        fmha_capabilities caps{};
        caps.struct_size = sizeof(caps);
        check(fmha_get_capabilities(device, &caps));
        py::dict d;
        d["available"] = caps.available != 0;
        d["dtypes"] = caps.dtypes;
        d["max_head_dim"] = caps.max_head_dim;
        d["features"] = caps.features;
        d["archs"] = std::string(caps.archs);
        return d;
      },
      py::arg("device"));
  m.def("version", [] { return std::string(fmha_version()); });
  m.attr("MAX_HEAD_DIM") = FMHA_MAX_HEAD_DIM;
}
