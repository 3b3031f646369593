// fmha._C: the params structs of fmha.h as Python objects, and the entry points.  Pointers
// and streams travel as Python ints; no torch header is included, so one build serves every
// torch release.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

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

  py::class_<fmha_problem> problem(m, "Problem");
  problem.def(py::init([] {
    fmha_fwd_params p;
    fmha_fwd_params_init(&p);
    return p.problem;
  }));
#define FMHA_FIELD(name) problem.def_readwrite(#name, &fmha_problem::name)
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
  FMHA_FIELD(alibi_batch_stride);
  FMHA_FIELD(dropout_p);
  FMHA_FIELD(seed);
  FMHA_FIELD(offset);
#undef FMHA_FIELD
  FMHA_PTR_PROPERTY(problem, fmha_problem, cu_seqlens_q, const int32_t*);
  FMHA_PTR_PROPERTY(problem, fmha_problem, cu_seqlens_k, const int32_t*);
  FMHA_PTR_PROPERTY(problem, fmha_problem, seqused_k, const int32_t*);
  FMHA_PTR_PROPERTY(problem, fmha_problem, alibi_slopes, const float*);

  py::class_<fmha_fwd_params> fwd(m, "FwdParams");
  fwd.def(py::init([] {
       fmha_fwd_params p;
       fmha_fwd_params_init(&p);
       return p;
     }))
      .def_readwrite("device", &fmha_fwd_params::device)
      .def_readwrite("problem", &fmha_fwd_params::problem)
      .def_readwrite("q", &fmha_fwd_params::q)
      .def_readwrite("k", &fmha_fwd_params::k)
      .def_readwrite("v", &fmha_fwd_params::v)
      .def_readwrite("out", &fmha_fwd_params::out)
      .def_readwrite("probs", &fmha_fwd_params::probs);
  FMHA_PTR_PROPERTY(fwd, fmha_fwd_params, lse, float*);

  py::class_<fmha_bwd_params> bwd(m, "BwdParams");
  bwd.def(py::init([] {
       fmha_bwd_params p;
       fmha_bwd_params_init(&p);
       return p;
     }))
      .def_readwrite("device", &fmha_bwd_params::device)
      .def_readwrite("problem", &fmha_bwd_params::problem)
      .def_readwrite("q", &fmha_bwd_params::q)
      .def_readwrite("k", &fmha_bwd_params::k)
      .def_readwrite("v", &fmha_bwd_params::v)
      .def_readwrite("out", &fmha_bwd_params::out)
      .def_readwrite("dout", &fmha_bwd_params::dout)
      .def_readwrite("dq", &fmha_bwd_params::dq)
      .def_readwrite("dk", &fmha_bwd_params::dk)
      .def_readwrite("dv", &fmha_bwd_params::dv)
      .def_readwrite("deterministic", &fmha_bwd_params::deterministic)
      .def_readwrite("workspace_size", &fmha_bwd_params::workspace_size);
  FMHA_PTR_PROPERTY(bwd, fmha_bwd_params, lse, const float*);
  FMHA_PTR_PROPERTY(bwd, fmha_bwd_params, dlse, const float*);
  FMHA_PTR_PROPERTY(bwd, fmha_bwd_params, workspace, void*);

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
  m.def(
      "fwd", [](const fmha_fwd_params& p, uintptr_t stream) { check(fmha_fwd(&p, as_ptr(stream))); },
      py::arg("params"), py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>());
  m.def(
      "bwd", [](const fmha_bwd_params& p, uintptr_t stream) { check(fmha_bwd(&p, as_ptr(stream))); },
      py::arg("params"), py::arg("stream") = 0, py::call_guard<py::gil_scoped_release>());
  m.def(
      "bwd_workspace_size",
      [](const fmha_bwd_params& p) {
        size_t bytes = 0;
        check(fmha_bwd_workspace_size(&p, &bytes));
        return bytes;
      },
      py::arg("params"));
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
