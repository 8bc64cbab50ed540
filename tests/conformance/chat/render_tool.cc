// Renders chat templates with tandem_chat for the conformance test (and by hand).
//
//   chat_template_render MODEL_DIR CONVERSATIONS_JSON
//     Loads MODEL_DIR's template and tokens (LoadChatTemplateFromDir) and renders each
//     conversation of the JSON array, with bos_token/eos_token added when the config has
//     them. Prints one JSON line per conversation: {"id", "ok", "text"} or {"id", "ok",
//     "error"}. Exits 2 when the template does not load (the error goes to stderr).
//   chat_template_render --template FILE CONTEXT_JSON
//     Renders FILE with the context object and prints the text.
#include <cstdio>
#include <iostream>
#include <string>

#include "common/chat/chat_template.h"
#include "common/util/file_util.h"

namespace {

using Json = nlohmann::ordered_json;

int RenderOne(const std::string& template_path, const std::string& context_text) {
  auto source = tandem::ReadFileToString(template_path);
  if (!source.ok()) {
    std::cerr << source.status() << "\n";
    return 2;
  }
  auto tmpl = tandem::chat::ChatTemplate::Compile(*source, template_path);
  if (!tmpl.ok()) {
    std::cerr << tmpl.status() << "\n";
    return 2;
  }
  Json context = Json::parse(context_text, nullptr, false);
  if (context.is_discarded()) {
    std::cerr << "context is not JSON\n";
    return 2;
  }
  auto text = (*tmpl)->Render(context);
  if (!text.ok()) {
    std::cerr << text.status() << "\n";
    return 1;
  }
  std::cout << *text;
  return 0;
}

int RenderConversations(const std::string& model_dir, const std::string& conversations_path) {
  auto loaded = tandem::chat::LoadChatTemplateFromDir(model_dir);
  if (!loaded.ok()) {
    std::cerr << loaded.status() << "\n";
    return 2;
  }
  auto text = tandem::ReadFileToString(conversations_path);
  if (!text.ok()) {
    std::cerr << text.status() << "\n";
    return 2;
  }
  Json conversations = Json::parse(*text, nullptr, false);
  if (!conversations.is_array()) {
    std::cerr << conversations_path << ": not a JSON array\n";
    return 2;
  }
  for (const Json& conv : conversations) {
    Json context = conv["context"];
    if (!loaded->bos_token.empty()) context["bos_token"] = loaded->bos_token;
    if (!loaded->eos_token.empty()) context["eos_token"] = loaded->eos_token;
    Json line = {{"id", conv["id"]}};
    auto out = loaded->tmpl->Render(context);
    line["ok"] = out.ok();
    if (out.ok()) {
      line["text"] = *out;
    } else {
      line["error"] = std::string(out.status().message());
    }
    std::cout << line.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--template") return RenderOne(argv[2], argv[3]);
  if (argc == 3) return RenderConversations(argv[1], argv[2]);
  std::cerr << "usage: chat_template_render MODEL_DIR CONVERSATIONS_JSON\n"
               "       chat_template_render --template FILE CONTEXT_JSON\n";
  return 2;
}
