// Checks at the Python boundary: every array reaches a kernel only as exactly the dtype, rank and C order
// it reads, never as an implicit converted copy (a converted output would be filled and thrown away; a
// converted array that the decoder keeps would dangle), and every failure is a ValueError naming the
// argument and what was passed. Used by binding.cpp (and any binding file that adds entry points).
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace lowbit::py {

namespace nb = nanobind;

// Read-only inputs (mmapped weights are read-only) and writable outputs, C-contiguous, on the CPU.
template <typename T, size_t D>
using In = nb::ndarray<const T, nb::ndim<D>, nb::c_contig, nb::device::cpu>;
template <typename T, size_t D>
using Out = nb::ndarray<T, nb::ndim<D>, nb::c_contig, nb::device::cpu>;
// Either dtype of a float weight / KV cache (float32, or bf16/f16 bits as uint16): checked by the caller.
template <size_t D>
using AnyIn = nb::ndarray<nb::ro, nb::ndim<D>, nb::c_contig, nb::device::cpu>;
template <size_t D>
using AnyOut = nb::ndarray<nb::ndim<D>, nb::c_contig, nb::device::cpu>;

[[noreturn]] inline void fail(const std::string& msg) { throw std::invalid_argument(msg); }
// The message is built only on failure (these run on every kernel call).
inline void require(bool ok, const char* msg) {
  if (!ok) fail(msg);
}

inline std::string pystr(nb::handle o) {
  PyObject* s = PyObject_Str(o.ptr());  // (nb::str(object&&) would reinterpret, not convert)
  if (!s) {
    PyErr_Clear();
    return "?";
  }
  const char* c = PyUnicode_AsUTF8(s);
  std::string r = c ? c : "?";
  if (!c) PyErr_Clear();
  Py_DECREF(s);
  return r;
}

// "float64 array of shape (3, 4), not C-contiguous, read-only" / "list" / "None".
inline std::string describe(nb::handle h) {
  if (!h.is_valid() || h.is_none()) return "None";
  try {
    if (nb::hasattr(h, "dtype") && nb::hasattr(h, "shape")) {
      std::string s = pystr(h.attr("dtype")) + " array of shape " + pystr(h.attr("shape"));
      if (nb::hasattr(h, "flags")) {
        nb::object f = h.attr("flags");
        if (!nb::cast<bool>(f.attr("c_contiguous"))) s += ", not C-contiguous";
        if (!nb::cast<bool>(f.attr("writeable"))) s += ", read-only";
      }
      return s;
    }
  } catch (const std::exception&) {
  }
  return pystr(nb::handle((PyObject*)Py_TYPE(h.ptr())).attr("__name__"));
}

template <typename T> constexpr const char* dtype_name() { return "?"; }
template <> constexpr const char* dtype_name<float>() { return "float32"; }
template <> constexpr const char* dtype_name<uint8_t>() { return "uint8"; }
template <> constexpr const char* dtype_name<int8_t>() { return "int8"; }
template <> constexpr const char* dtype_name<uint16_t>() { return "uint16"; }
template <> constexpr const char* dtype_name<int32_t>() { return "int32"; }
template <> constexpr const char* dtype_name<int64_t>() { return "int64"; }

// `what` names the argument in the error ("gemm_int: y"); the message is built only on failure.
template <typename A>
A cast_exact(nb::handle h, const char* what, const char* want, const char* dtype, size_t ndim) {
  A a;
  if (h.is_valid() && !h.is_none() && nb::try_cast<A>(h, a, /*convert=*/false)) return a;
  fail(std::string(what) + " must be " + want + dtype + " array with " + std::to_string(ndim) + " dimension(s), got " +
       describe(h));
}

template <typename T, size_t D>
In<T, D> in(nb::handle h, const char* what) {
  return cast_exact<In<T, D>>(h, what, "a C-contiguous ", dtype_name<T>(), D);
}

template <typename T, size_t D>
Out<T, D> out(nb::handle h, const char* what) {
  return cast_exact<Out<T, D>>(h, what, "a writable C-contiguous ", dtype_name<T>(), D);
}

template <size_t D>
AnyIn<D> any_in(nb::handle h, const char* what) {
  return cast_exact<AnyIn<D>>(h, what, "a C-contiguous ", "float32 (or uint16)", D);
}

template <size_t D>
AnyOut<D> any_out(nb::handle h, const char* what) {
  return cast_exact<AnyOut<D>>(h, what, "a writable C-contiguous ", "float32 (or uint16)", D);
}

// Optional argument: None -> an empty array (data() == nullptr).
template <typename T, size_t D>
In<T, D> in_or_none(nb::handle h, const char* what) {
  if (!h.is_valid() || h.is_none()) return In<T, D>();
  return in<T, D>(h, what);
}

template <typename T>
T scalar(nb::handle h, const char* what) {
  T v;
  if (h.is_valid() && nb::try_cast<T>(h, v)) return v;
  fail(std::string(what) + " must be a number, got " + describe(h));
}

inline std::vector<nb::object> to_vector(nb::handle h) {
  std::vector<nb::object> v;
  for (nb::handle x : h) v.push_back(nb::borrow(x));
  return v;
}

// A tuple (or list) of exactly n items.
inline std::vector<nb::object> items(nb::handle h, size_t n, const char* what) {
  const bool is_seq = h.is_valid() && (nb::isinstance<nb::tuple>(h) || nb::isinstance<nb::list>(h));
  if (!is_seq || nb::len(h) != n)
    fail(std::string(what) + " must be a tuple of " + std::to_string(n) + " items, got " + describe(h) +
         (is_seq ? " of " + std::to_string(nb::len(h)) : ""));
  return to_vector(h);
}

// A list or tuple of any length.
inline std::vector<nb::object> seq(nb::handle h, const char* what) {
  if (!h.is_valid() || !(nb::isinstance<nb::tuple>(h) || nb::isinstance<nb::list>(h)))
    fail(std::string(what) + " must be a list or tuple, got " + describe(h));
  return to_vector(h);
}

// a is [r, c] (a 2-D array)
template <typename A>
bool is_shape(const A& a, int64_t r, int64_t c) {
  return a.shape(0) == (size_t)r && a.shape(1) == (size_t)c;
}

}  // namespace lowbit::py
