#include "server/ui.h"

#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>
#include <system_error>
#include <vector>

#include <spdlog/spdlog.h>

#include "server/problem.h"
#include "log.h"

namespace kstate::server {
namespace {

namespace fs = std::filesystem;

// The dashboard is a few hundred KiB; anything much larger in ui_dir is a mistake
// (a stray file, a core dump) and must not be read into memory on an I/O thread.
constexpr std::uintmax_t max_file_bytes = 8u << 20;

struct content_type_row {
  std::string_view extension;
  std::string_view content_type;
};

// Only the types a Vite build produces; anything else is served as opaque bytes.
constexpr content_type_row content_types[] = {
    {".html", "text/html; charset=utf-8"},
    {".js", "text/javascript; charset=utf-8"},
    {".mjs", "text/javascript; charset=utf-8"},
    {".css", "text/css; charset=utf-8"},
    {".svg", "image/svg+xml"},
    {".png", "image/png"},
    {".json", "application/json"},
    {".map", "application/json"},
    {".woff2", "font/woff2"},
    {".ico", "image/x-icon"},
    {".txt", "text/plain; charset=utf-8"},
};

std::string_view content_type_for(std::string_view name) {
  for (const auto& row : content_types) {
    if (name.size() > row.extension.size() && name.ends_with(row.extension)) return row.content_type;
  }
  return "application/octet-stream";
}

// A segment that names one entry inside its directory and nothing else. Dot files are
// refused too: the build never produces them, and ui_dir may sit next to things
// (.git, .env) that must not be served.
bool safe_segment(const std::string& s) {
  if (s.empty() || s.front() == '.') return false;
  for (char c : s) {
    if (c == '/' || c == '\\' || c == '\0') return false;
  }
  return true;
}

// Vite names built assets "<name>-<hash>.<ext>" under assets/, the hash being Rollup's
// 8 base64url characters of the content (which may themselves include '-' or '_'):
// such a file never changes under its name, so a browser may keep it for a year.
// Anything else may change in place.
constexpr size_t hash_chars = 8;

bool immutable_asset(const std::vector<std::string>& rel) {
  if (rel.size() != 2 || rel[0] != "assets") return false;
  std::string_view name = rel[1];
  auto dot = name.rfind('.');
  if (dot == std::string_view::npos) return false;
  auto stem = name.substr(0, dot);
  if (stem.size() < hash_chars + 2 || stem[stem.size() - hash_chars - 1] != '-') return false;
  for (char c : stem.substr(stem.size() - hash_chars)) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

std::optional<std::string> read_file(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec) || ec) return std::nullopt;
  auto size = fs::file_size(p, ec);
  if (ec || size > max_file_bytes) return std::nullopt;
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  std::string body{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) return std::nullopt;
  return body;
}

http::response file_response(const http::request& req, std::string body, std::string_view type,
                             std::string_view cache_control) {
  http::response r;
  r.content_type = std::string(type);
  // HEAD: the same headers, no body. (The server frames it with Content-Length: 0.)
  if (req.method != "HEAD") r.body = std::move(body);
  r.with_header("Cache-Control", std::string(cache_control));
  r.with_header("X-Content-Type-Options", "nosniff");
  return r;
}

http::response index_response(const http::request& req, const fs::path& root) {
  auto body = read_file(root / "index.html");
  if (!body) {
    // Where the files are is the operator's business, not the caller's: the log says.
    server_log()->warn(
        "the dashboard is not built: {} is missing (scripts/demo and scripts/test build it; or run npm ci "
        "&& npm run build in web/)",
        (root / "index.html").string());
    return problem(failure_reason::route_not_found, "the dashboard is not built on this instance", req.path);
  }
  auto r = file_response(req, std::move(*body), "text/html; charset=utf-8", "no-cache");
  // The page talks only to this origin; nothing else may be loaded or framed.
  r.with_header("Content-Security-Policy",
                "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
                "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'");
  r.with_header("Referrer-Policy", "no-referrer");
  return r;
}

}  // namespace

std::optional<http::response> serve_ui(const http::request& req, const std::string& dir) {
  if (req.segments.empty() || req.segments[0] != "ui") return std::nullopt;
  if (req.method != "GET" && req.method != "HEAD")
    return problem(failure_reason::method_not_allowed, req.method + " is not allowed on " + req.path, req.path)
        .with_header("Allow", "GET, HEAD");

  // "/ui" and "/ui/" are the page itself.
  std::vector<std::string> rel(req.segments.begin() + 1, req.segments.end());
  if (!rel.empty() && rel.back().empty()) rel.pop_back();  // a trailing '/'
  const fs::path root(dir);
  if (rel.empty()) return index_response(req, root);

  // Segments are percent-decoded already, so "%2e%2e" arrives as ".." and "a%2Fb" as
  // "a/b": each is checked whole, and none can name anything outside `dir`.
  for (const auto& s : rel) {
    if (!safe_segment(s)) return problem(failure_reason::route_not_found, "no dashboard file at " + req.path, req.path);
  }
  fs::path p = root;
  for (const auto& s : rel) p /= s;
  if (auto body = read_file(p)) {
    return file_response(req, std::move(*body), content_type_for(rel.back()),
                         immutable_asset(rel) ? "public, max-age=31536000, immutable" : "no-cache");
  }
  // A path that looks like a file (has an extension) and is not there is a 404: a
  // stale index.html asking for an asset of an older build must fail visibly, not get
  // HTML back as JavaScript. Anything else is a page of the app: the app routes it.
  if (rel.back().find('.') != std::string::npos || rel[0] == "assets")
    return problem(failure_reason::route_not_found, "no dashboard file at " + req.path, req.path);
  return index_response(req, root);
}

}  // namespace kstate::server
