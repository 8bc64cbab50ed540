// Builds a Tokenizer from tokenizer.json and tokenizer_config.json text.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/pattern.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/file_util.h"
#include "common/util/json_fields.h"
#include "common/util/status_macros.h"

namespace tandem::tokenizer {

using nlohmann::json;

class TokenizerLoader {
 public:
  static absl::Status ParseAddedTokens(const json& j, const std::string& source, Tokenizer* t);
  static absl::Status ParsePostProcessor(const json& j, const std::string& source, Tokenizer* t);
  static absl::Status ApplyConfig(std::string_view text, const std::string& source, Tokenizer* t);
};

namespace {

const json& Field(const json& j, const char* key) {
  static const json* null_json = new json();
  auto it = j.find(key);
  return it == j.end() ? *null_json : *it;
}

absl::StatusOr<std::vector<int32_t>> SpecialIds(const json& special_tokens, const std::string& name,
                                                const std::string& source) {
  auto it = special_tokens.find(name);
  if (it == special_tokens.end() || !it->is_object() || !it->contains("ids") ||
      !(*it)["ids"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": template names special token \"",
                                                   name, "\" without an \"ids\" list"));
  }
  std::vector<int32_t> ids;
  for (const json& id : (*it)["ids"]) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 24)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": special token \"", name, "\" has a bad id ", id.dump()));
    }
    ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return ids;
}

// TemplateProcessing "single": ids before sequence A go in front, ids after it behind.
absl::Status ParseTemplate(const json& j, const std::string& source, std::vector<int32_t>* prefix,
                           std::vector<int32_t>* suffix) {
  const json& single = Field(j, "single");
  if (!single.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key \"single\" must be a list"));
  }
  const json& specials = Field(j, "special_tokens");
  bool seen_sequence = false;
  for (const json& item : single) {
    if (item.is_object() && item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    const json& special = item.is_object() ? Field(item, "SpecialToken") : item;
    if (!special.is_object() || !Field(special, "id").is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": template item ", item.dump(), " is not understood"));
    }
    TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                            SpecialIds(specials, special["id"].get<std::string>(), source));
    auto* target = seen_sequence ? suffix : prefix;
    target->insert(target->end(), ids.begin(), ids.end());
  }
  return absl::OkStatus();
}

// Bert/Roberta processors store ["[CLS]", 101] pairs.
absl::StatusOr<int32_t> PairId(const json& j, const char* key, const std::string& source) {
  const json& pair = Field(j, key);
  if (!pair.is_array() || pair.size() != 2 || !pair[1].is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": key \"", key, "\" must be [token, id]"));
  }
  return static_cast<int32_t>(pair[1].get<int64_t>());
}

// bos_token / eos_token are a string, {"content": ...} or null.
std::string ConfigToken(const json& config, const char* key) {
  const json& v = Field(config, key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && Field(v, "content").is_string()) return v["content"].get<std::string>();
  return "";
}

}  // namespace

absl::Status TokenizerLoader::ParseAddedTokens(const json& j, const std::string& source,
                                               Tokenizer* t) {
  if (j.is_null()) return absl::OkStatus();
  if (!j.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": key \"added_tokens\" must be a list"));
  }
  for (size_t i = 0; i < j.size(); ++i) {
    std::string where = absl::StrCat(source, " added_tokens[", i, "]");
    TANDEM_RETURN_IF_ERROR(RequireObject(j[i], where));
    JsonFields f(j[i], where);
    AddedToken token;
    TANDEM_ASSIGN_OR_RETURN(int64_t id, f.Int("id", 0, (1 << 24) - 1));
    token.id = static_cast<int32_t>(id);
    TANDEM_ASSIGN_OR_RETURN(token.content, f.String("content"));
    if (token.content.empty()) return f.Error("content", "must not be empty");
    TANDEM_ASSIGN_OR_RETURN(token.special, f.BoolOr("special", false));
    TANDEM_ASSIGN_OR_RETURN(token.lstrip, f.BoolOr("lstrip", false));
    TANDEM_ASSIGN_OR_RETURN(token.rstrip, f.BoolOr("rstrip", false));
    TANDEM_ASSIGN_OR_RETURN(token.single_word, f.BoolOr("single_word", false));
    TANDEM_ASSIGN_OR_RETURN(token.normalized, f.BoolOr("normalized", !token.special));
    t->added_by_id_[token.id] = t->added_tokens_.size();
    t->added_by_content_.try_emplace(token.content, token.id);
    t->added_tokens_.push_back(std::move(token));
  }
  return absl::OkStatus();
}

absl::Status TokenizerLoader::ParsePostProcessor(const json& j, const std::string& source,
                                                 Tokenizer* t) {
  if (j.is_null()) return absl::OkStatus();
  TANDEM_ASSIGN_OR_RETURN(std::string type, TypeOf(j, source));
  if (type == "ByteLevel") return absl::OkStatus();  // Offsets only; ids are unchanged.
  if (type == "TemplateProcessing") {
    return ParseTemplate(j, source, &t->prefix_ids_, &t->suffix_ids_);
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    TANDEM_ASSIGN_OR_RETURN(int32_t cls, PairId(j, "cls", source));
    TANDEM_ASSIGN_OR_RETURN(int32_t sep, PairId(j, "sep", source));
    t->prefix_ids_.push_back(cls);
    t->suffix_ids_.push_back(sep);
    return absl::OkStatus();
  }
  if (type == "Sequence") {
    const json& list = Field(j, "processors");
    if (!list.is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": key \"processors\" must be a list"));
    }
    for (size_t i = 0; i < list.size(); ++i) {
      TANDEM_RETURN_IF_ERROR(
          ParsePostProcessor(list[i], absl::StrCat(source, ".processors[", i, "]"), t));
    }
    return absl::OkStatus();
  }
  return absl::UnimplementedError(absl::StrCat(
      source, ": post_processor type \"", type,
      "\" is not supported (TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing, "
      "Sequence)"));
}

absl::Status TokenizerLoader::ApplyConfig(std::string_view text, const std::string& source,
                                          Tokenizer* t) {
  json config = json::object();
  if (!text.empty()) {
    TANDEM_ASSIGN_OR_RETURN(config, ParseJsonObject(text, source));
  }
  for (auto [key, id] : {std::pair{"bos_token", &t->bos_id_}, {"eos_token", &t->eos_id_}}) {
    std::string token = ConfigToken(config, key);
    if (token.empty()) continue;
    *id = t->TokenToId(token);
    if (*id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": key \"", key, "\" names \"", token, "\", not in the vocab"));
    }
  }
  // add_bos_token / add_eos_token override the template, as transformers' fast tokenizers do.
  JsonFields f(config, source);
  for (auto [key, id, ids] : {std::tuple{"add_bos_token", t->bos_id_, &t->prefix_ids_},
                              {"add_eos_token", t->eos_id_, &t->suffix_ids_}}) {
    if (!f.HasValue(key) || id < 0) continue;
    TANDEM_ASSIGN_OR_RETURN(bool add, f.BoolOr(key, false));
    ids->erase(std::remove(ids->begin(), ids->end(), id), ids->end());
    if (add) ids->insert(std::string_view(key) == "add_bos_token" ? ids->begin() : ids->end(), id);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view tokenizer_json,
                                                               std::string_view config_json,
                                                               const std::string& source) {
  TANDEM_ASSIGN_OR_RETURN(json j, ParseJsonObject(tokenizer_json, source));
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  std::string src(source);
  if (!j.contains("model")) {
    return absl::InvalidArgumentError(absl::StrCat(src, ": key \"model\" is missing"));
  }
  TANDEM_ASSIGN_OR_RETURN(t->model_, BpeModel::Parse(j["model"], src + " model"));
  TANDEM_ASSIGN_OR_RETURN(t->normalizer_,
                          ParseNormalizer(Field(j, "normalizer"), src + " normalizer"));
  TANDEM_ASSIGN_OR_RETURN(t->pre_tokenizer_,
                          ParsePreTokenizer(Field(j, "pre_tokenizer"), src + " pre_tokenizer"));
  TANDEM_ASSIGN_OR_RETURN(t->decoder_, ParseDecoder(Field(j, "decoder"), src + " decoder"));
  TANDEM_RETURN_IF_ERROR(TokenizerLoader::ParseAddedTokens(Field(j, "added_tokens"), src, t.get()));
  TANDEM_RETURN_IF_ERROR(TokenizerLoader::ParsePostProcessor(Field(j, "post_processor"),
                                                             src + " post_processor", t.get()));
  std::vector<AddedToken> raw, normalized;
  for (const AddedToken& a : t->added_tokens_) (a.normalized ? normalized : raw).push_back(a);
  t->raw_matcher_ = std::make_unique<AddedTokenMatcher>(raw);
  t->normalized_matcher_ = std::make_unique<AddedTokenMatcher>(normalized);
  t->vocab_size_ = t->model_->vocab_size();
  for (const AddedToken& a : t->added_tokens_) t->vocab_size_ = std::max(t->vocab_size_, a.id + 1);
  std::string config_source = "tokenizer_config.json";
  if (size_t slash = src.rfind('/'); slash != std::string::npos) {
    config_source = src.substr(0, slash + 1) + config_source;
  }
  TANDEM_RETURN_IF_ERROR(TokenizerLoader::ApplyConfig(config_json, config_source, t.get()));
  for (const auto* ids : {&t->prefix_ids_, &t->suffix_ids_}) {
    for (int32_t id : *ids) {
      if (!t->IdToToken(id).empty()) continue;
      return absl::InvalidArgumentError(
          absl::StrCat(src, ": post_processor adds id ", id, ", which is not in the vocab"));
    }
  }
  return t;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& model_dir) {
  std::string path = model_dir + "/tokenizer.json";
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  std::string config;
  std::string config_path = model_dir + "/tokenizer_config.json";
  if (FileExists(config_path)) {
    TANDEM_ASSIGN_OR_RETURN(config, ReadFileToString(config_path));
  }
  return FromJson(text, config, path);
}

}  // namespace tandem::tokenizer
