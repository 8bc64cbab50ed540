#include "tests/unit/tokenizer/test_tokenizers.h"

#include "common/tokenizer/byte_level.h"

namespace tandem::tokenizer::testing {

using nlohmann::json;

json ByteLevelJson() {
  const ByteLevelTable& table = ByteLevelTable::Get();
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[table.Encode(static_cast<unsigned char>(b))] = b;
  // Merges in both accepted forms: "a b" strings and ["a", "b"] pairs.
  std::vector<std::pair<std::string, std::string>> merges = {
      {"\xC4\xA0", "t"},        {"l", "l"},           {"h", "e"},
      {"\xC4\xA0t", "he"},      {"he", "ll"},         {"hell", "o"},
      {"\xC4\xA0", "\xC4\xA0"}, {"\xC4\xA0", "hello"}};
  json merge_list = json::array();
  int next = 256;
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& [a, b] = merges[i];
    vocab[a + b] = next++;
    if (i % 2 == 0) {
      merge_list.push_back(a + " " + b);
    } else {
      merge_list.push_back(json::array({a, b}));
    }
  }
  json doc = {
      {"version", "1.0"},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array(
             {{{"type", "Split"},
               {"pattern",
                {{"Regex",
                  R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
               {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"post_processor", {{"type", "ByteLevel"}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens",
       json::array({{{"id", 300}, {"content", "<|bos|>"}, {"special", true}},
                    {{"id", 301}, {"content", "<tool>"}, {"special", false}, {"rstrip", true}}})},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}, {"ignore_merges", false}}}};
  return doc;
}

json SentencePieceJson() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  char name[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  const std::string sp = "\xE2\x96\x81";  // U+2581
  int next = 259;
  for (const std::string& s :
       {sp, std::string("h"), std::string("e"), std::string("l"), std::string("o"),
        std::string("w"), std::string("r"), std::string("d")}) {
    vocab[s] = next++;
  }
  json merges = json::array();
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{{sp, "h"},
                                                                             {"e", "l"},
                                                                             {"el", "l"},
                                                                             {sp + "h", "ell"},
                                                                             {sp + "hell", "o"},
                                                                             {"o", "r"},
                                                                             {sp, "w"}}) {
    vocab[a + b] = next++;
    merges.push_back(json::array({a, b}));
  }
  json special = {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}};
  return {
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         json::array({{{"type", "Prepend"}, {"prepend", sp}},
                      {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", sp}}})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"special_tokens", special}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         json::array({{{"type", "Replace"}, {"pattern", {{"String", sp}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"added_tokens", json::array({{{"id", 0}, {"content", "<unk>"}, {"special", true}},
                                    {{"id", 1}, {"content", "<s>"}, {"special", true}},
                                    {{"id", 2}, {"content", "</s>"}, {"special", true}}})},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", merges},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true}}}};
}

int Id(const json& doc, const std::string& token) {
  for (const auto& a : doc["added_tokens"]) {
    if (a["content"] == token) return a["id"].get<int>();
  }
  auto it = doc["model"]["vocab"].find(token);
  return it == doc["model"]["vocab"].end() ? -1 : it->get<int>();
}

}  // namespace tandem::tokenizer::testing
