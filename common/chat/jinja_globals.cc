// Argument binding for built-ins, and the global functions: range, namespace, dict,
// raise_exception (the way templates reject a conversation) and strftime_now.
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/chat/jinja_access.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/jinja_format.h"
#include "common/chat/render_state.h"

namespace tandem::chat {
namespace {

constexpr char kRaisedUrl[] = "tandem.chat/raised";

absl::StatusOr<Value> Range(const CallArgs& args, RenderState& state) {
  if (!args.keyword.empty())
    return absl::InvalidArgumentError("range() takes no keyword arguments");
  size_t n = args.positional.size();
  if (n < 1 || n > 3) {
    return absl::InvalidArgumentError(absl::StrCat("range expected 1 to 3 arguments, got ", n));
  }
  for (const Value& v : args.positional) {
    if (!v.is_integral()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", TypeName(v), "' object cannot be interpreted as an integer"));
    }
  }
  Int start = n == 1 ? 0 : args.positional[0].int_value();
  Int stop = n == 1 ? args.positional[0].int_value() : args.positional[1].int_value();
  Int step = n == 3 ? args.positional[2].int_value() : 1;
  if (step == 0) return absl::InvalidArgumentError("range() arg 3 must not be zero");
  Int count = 0;
  if (step > 0 && stop > start) count = (stop - start + step - 1) / step;
  if (step < 0 && stop < start) count = (start - stop - step - 1) / -step;
  if (count > state.limits().max_range) {
    return absl::ResourceExhaustedError(
        absl::StrCat("range too big: more than ", state.limits().max_range, " items"));
  }
  if (auto s = state.heap().ChargeItems(static_cast<size_t>(count)); !s.ok()) return s;
  std::vector<Value> items;
  items.reserve(static_cast<size_t>(count));
  for (Int i = 0; i < count; ++i) items.push_back(Value::Integer(start + i * step));
  return state.heap().NewSequence(std::move(items));
}

// dict(mapping_or_pairs, **kwargs) and namespace(...): fills `out`.
absl::Status FillDict(std::string_view fn, const CallArgs& args, Dict& out, RenderState& state) {
  if (args.positional.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(fn), "() takes at most 1 positional argument"));
  }
  if (!args.positional.empty()) {
    const Value& src = args.positional[0];
    if (src.is_dict() || src.is_namespace()) {
      for (const auto& [k, v] : src.dict()->entries()) {
        if (auto s = out.Set(k, v); !s.ok()) return s;
      }
    } else {
      auto items = Iterate(src, state);
      if (!items.ok()) return items.status();
      for (const Value& pair : *items) {
        if (!pair.is_sequence() || pair.list()->items.size() != 2) {
          return absl::InvalidArgumentError(
              absl::StrCat(std::string(fn), "() needs a mapping or a sequence of key/value pairs"));
        }
        if (auto s = out.Set(pair.list()->items[0], pair.list()->items[1]); !s.ok()) return s;
      }
    }
  }
  for (const auto& [k, v] : args.keyword) out.SetString(k, v);
  return state.heap().ChargeItems(out.size());
}

absl::StatusOr<Value> StrftimeNow(const CallArgs& args, RenderState& state) {
  auto bound = BindArgs("strftime_now", args, {"format"}, 1);
  if (!bound.ok()) return bound.status();
  const Value& fmt = *(*bound)[0];
  if (!fmt.is_string()) return absl::InvalidArgumentError("strftime_now() format must be a str");
  return state.heap().NewString(absl::FormatTime(fmt.str(), state.Now(), state.time_zone()));
}

}  // namespace

absl::StatusOr<std::vector<std::optional<Value>>> BindArgs(
    std::string_view fn, const CallArgs& args, const std::vector<std::string_view>& names,
    size_t required) {
  std::vector<std::optional<Value>> out(names.size());
  if (args.positional.size() > names.size()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(fn), "() takes at most ",
                                                   names.size(), " argument(s) (",
                                                   args.positional.size(), " given)"));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) out[i] = args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    size_t i = 0;
    while (i < names.size() && names[i] != key) ++i;
    if (i == names.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(fn), "() got an unexpected keyword argument '", key, "'"));
    }
    if (out[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(fn), "() got multiple values for argument '", key, "'"));
    }
    out[i] = value;
  }
  for (size_t i = 0; i < required; ++i) {
    if (!out[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          std::string(fn), "() missing required argument '", std::string(names[i]), "'"));
    }
  }
  return out;
}

absl::Status TemplateRaised(std::string message) {
  absl::Status s = absl::InvalidArgumentError(std::move(message));
  s.SetPayload(kRaisedUrl, absl::Cord("1"));
  return s;
}

bool IsTemplateRaised(const absl::Status& status) {
  return status.GetPayload(kRaisedUrl).has_value();
}

bool IsGlobalFunction(std::string_view name) {
  return name == "range" || name == "namespace" || name == "dict" || name == "raise_exception" ||
         name == "strftime_now";
}

absl::StatusOr<Value> CallGlobal(std::string_view name, const CallArgs& args, RenderState& state) {
  if (name == "range") return Range(args, state);
  if (name == "namespace" || name == "dict") {
    auto dict = state.heap().NewDict();
    if (!dict.ok()) return dict.status();
    if (auto s = FillDict(name, args, **dict, state); !s.ok()) return s;
    return name == "dict" ? Value::DictOf(*dict) : Value::NamespaceOf(*dict);
  }
  if (name == "raise_exception") {
    auto bound = BindArgs("raise_exception", args, {"message"}, 0);
    if (!bound.ok()) return bound.status();
    std::string message = "raise_exception() called";
    if ((*bound)[0]) {
      auto text = ToStr(*(*bound)[0], state.format());
      if (!text.ok()) return text.status();
      message = std::move(*text);
    }
    return TemplateRaised(std::move(message));
  }
  if (name == "strftime_now") return StrftimeNow(args, state);
  return absl::InvalidArgumentError(absl::StrCat("'", std::string(name), "' is undefined"));
}

}  // namespace tandem::chat
