// manifest.json reading, validation, checksums and writing (see manifest.h; fields in FORMAT.md).
#include "data/format/manifest.h"

#include <nlohmann/json.hpp>

#include "data/format/shard.h"
#include "common/errors.h"
#include "common/checksum.h"
#include "common/files.h"
#include "common/log.h"

namespace lm::data {
namespace {

using json = nlohmann::ordered_json;

// Typed field access that names the manifest file and the dotted field on any problem.
class Fields {
 public:
  explicit Fields(const std::string& path) : path_(path) {}

  const json& at(const json& obj, const std::string& key, const std::string& where) const {
    if (!obj.is_object()) fail(where.empty() ? "top level" : where, "must be an object");
    auto it = obj.find(key);
    if (it == obj.end()) fail(name(where, key), "missing field");
    return *it;
  }
  std::string str(const json& obj, const std::string& key, const std::string& where = "") const {
    const json& v = at(obj, key, where);
    if (!v.is_string()) fail(name(where, key), "must be a string");
    return v.get<std::string>();
  }
  uint64_t uint(const json& obj, const std::string& key, const std::string& where = "") const {
    const json& v = at(obj, key, where);
    if (!v.is_number_unsigned()) fail(name(where, key), "must be a non-negative integer");
    return v.get<uint64_t>();
  }
  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    throw DataError(path_ + ": field '" + field + "': " + why);
  }

 private:
  static std::string name(const std::string& where, const std::string& key) {
    return where.empty() ? key : where + "." + key;
  }
  std::string path_;
};

bool is_hex64(const std::string& s) {
  return s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

void check_xxh64(const std::string& path, const std::string& want) {
  const std::string got = hex64(xxh64_file(path));
  if (got != want) throw DataError(path + ": checksum " + got + " does not match manifest.json (" + want + ")");
}

}  // namespace

std::string compute_data_version(const std::vector<ShardInfo>& shards, const std::string& tokenizer_hash) {
  std::string s;
  for (const auto& sh : shards) s += sh.xxh64 + "\n";
  s += tokenizer_hash + "\n";
  return hex64(xxh64(s.data(), s.size()));
}

uint64_t ShardInfo::bytes(const std::string& dtype) const {
  return 64 + 8 * (docs + 1) + (dtype == "uint16" ? 2 : 4) * tokens;
}

Manifest Manifest::load(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  return parse(files::read_file(path), path, dir);
}

Manifest Manifest::parse(const std::string& text, const std::string& path, const std::string& dir) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // also out_of_range: a number like 1e999
    throw DataError(path + ": invalid JSON (" + e.what() + ")");
  }
  Fields f(path);
  Manifest m;
  m.dir = dir;
  m.version = static_cast<int>(f.uint(j, "version"));
  if (m.version != 1) f.fail("version", strf("unsupported manifest version %d (expected 1)", m.version));
  m.dtype = f.str(j, "dtype");
  if (m.dtype != "uint16" && m.dtype != "uint32") f.fail("dtype", "must be \"uint16\" or \"uint32\"");

  const json& t = f.at(j, "tokenizer", "");
  TokenizerInfo& ti = m.tokenizer;
  ti.kind = f.str(t, "kind", "tokenizer");
  if (ti.kind != "bytes" && ti.kind != "sentencepiece")
    f.fail("tokenizer.kind", "must be \"bytes\" or \"sentencepiece\"");
  ti.vocab_size = f.uint(t, "vocab_size", "tokenizer");
  ti.eos_id = static_cast<uint32_t>(f.uint(t, "eos_id", "tokenizer"));
  ti.pad_id = static_cast<uint32_t>(f.uint(t, "pad_id", "tokenizer"));
  if (ti.eos_id >= ti.vocab_size || ti.pad_id >= ti.vocab_size)
    f.fail("tokenizer", "eos_id and pad_id must be < vocab_size");
  if ((m.dtype == "uint16") != (dtype_for_vocab(ti.vocab_size) == TokenDtype::kU16))
    f.fail("dtype", "does not match tokenizer.vocab_size");
  ti.file = f.str(t, "file", "tokenizer");
  ti.hash = f.str(t, "hash", "tokenizer");
  // The bytes tokenizer's ids are fixed: a changed digit here would silently change the stream.
  if (ti.kind == "bytes" && (ti.vocab_size != 258 || ti.eos_id != 256 || ti.pad_id != 257 || !ti.file.empty()))
    f.fail("tokenizer", "the bytes tokenizer has vocab_size 258, eos_id 256, pad_id 257 and no file");

  const json& shards = f.at(j, "shards", "");
  if (!shards.is_array()) f.fail("shards", "must be an array");
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string where = strf("shards[%zu]", i);
    ShardInfo s;
    s.file = f.str(shards[i], "file", where);
    s.split = f.str(shards[i], "split", where);
    s.tokens = f.uint(shards[i], "tokens", where);
    s.docs = f.uint(shards[i], "docs", where);
    s.xxh64 = f.str(shards[i], "xxh64", where);
    if (s.split != "train" && s.split != "val") f.fail(where + ".split", "must be \"train\" or \"val\"");
    if (s.file.empty() || s.file.find('/') != std::string::npos)
      f.fail(where + ".file", "must be a plain file name");
    if (!is_hex64(s.xxh64)) f.fail(where + ".xxh64", "must be 16 lowercase hex digits");
    m.shards.push_back(s);
  }
  m.data_version = f.str(j, "data_version");
  if (m.data_version != compute_data_version(m.shards, ti.hash))
    f.fail("data_version", "does not match the shard checksums and tokenizer hash");
  return m;
}

std::vector<ShardInfo> Manifest::split(const std::string& name) const {
  std::vector<ShardInfo> out;
  for (const auto& s : shards)
    if (s.split == name) out.push_back(s);
  return out;
}

uint64_t Manifest::split_tokens(const std::string& name) const {
  uint64_t n = 0;
  for (const auto& s : shards)
    if (s.split == name) n += s.tokens;
  return n;
}

std::unique_ptr<ShardReader> ShardSource::open(const ShardInfo& s) {
  std::shared_ptr<const void> hold;
  auto r = std::make_unique<ShardReader>(fetch(s, &hold));
  r->hold(std::move(hold));
  return r;
}

void ShardSource::verify(const ShardInfo& s) {
  std::shared_ptr<const void> hold;
  fetch(s, &hold);
}

std::unique_ptr<ShardReader> Manifest::open_shard(const ShardInfo& s) const {
  auto r = source ? source->open(s) : std::make_unique<ShardReader>(dir + "/" + s.file);
  if (r->num_docs() != s.docs || r->num_tokens() != s.tokens || (r->dtype() == TokenDtype::kU16) != (dtype == "uint16"))
    throw DataError(r->path() + ": does not match its entry in manifest.json (docs, tokens or dtype)");
  return r;
}

void Manifest::verify_shard(const ShardInfo& s) const {
  if (source) source->verify(s);  // checked there, before it is used
  else check_xxh64(dir + "/" + s.file, s.xxh64);
}

void Manifest::verify() const {
  if (source) throw Error(dir + ": verify() is for local datasets");
  for (const auto& s : shards) verify_shard(s);
  if (!tokenizer.file.empty()) check_xxh64(dir + "/" + tokenizer.file, tokenizer.hash);
}

std::string Manifest::to_json() const {
  json j;
  j["version"] = version;
  j["dtype"] = dtype;
  j["tokenizer"] = {{"kind", tokenizer.kind},     {"vocab_size", tokenizer.vocab_size},
                    {"eos_id", tokenizer.eos_id}, {"pad_id", tokenizer.pad_id},
                    {"file", tokenizer.file},     {"hash", tokenizer.hash}};
  j["shards"] = json::array();
  for (const auto& s : shards)
    j["shards"].push_back(
        {{"file", s.file}, {"split", s.split}, {"tokens", s.tokens}, {"docs", s.docs}, {"xxh64", s.xxh64}});
  j["data_version"] = data_version;
  return j.dump(2) + "\n";
}

}  // namespace lm::data
