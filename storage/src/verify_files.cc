// Live-file checks: that the files RocksDB lives on are still on disk.
//
// On Linux a file deleted while RocksDB holds it open keeps working until it is closed,
// so a deleted SST file, MANIFEST or write-ahead log goes unnoticed until the next open
// (or a table-cache eviction), which then fails, or loses what the file held. The check
// lists the live files and looks each up on disk; the database is reported damaged
// (db::must_reopen()) only for a file that is missing and still live afterwards: RocksDB
// never deletes a live file, and never reuses a file number, so a file live both before
// and after it was seen missing was deleted by someone else.

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <set>

#include "core/guard.h"
#include "core/thread_name.h"
#include "db_impl.h"

namespace kstate::storage {

namespace {

bool on_disk(const std::string& file) {
  struct stat st {};
  return ::stat(file.c_str(), &st) == 0 || errno != ENOENT;  // only a file known missing counts
}

// The live SST, MANIFEST, CURRENT and OPTIONS files, as paths; empty on a listing error
// (a check that cannot list finds nothing missing).
std::set<std::string> live_files(rocksdb::DB& rdb, const std::string& dir) {
  std::vector<std::string> names;
  uint64_t manifest_size = 0;
  std::set<std::string> out;
  // flush_memtable=false: listing must not write anything.
  if (auto s = rdb.GetLiveFiles(names, &manifest_size, false); !s.ok()) {
    storage_log()->warn("listing the live files: {}", s.ToString());
    return out;
  }
  for (const auto& n : names) out.insert(dir + n);  // names start with '/'
  return out;
}

// Whether the current write-ahead log is on disk (RocksDB looks it up by its number);
// `why` says what failed when it is not.
bool current_wal_on_disk(rocksdb::DB& rdb, std::string& why) {
  std::unique_ptr<rocksdb::LogFile> wal;
  auto s = rdb.GetCurrentWalFile(&wal);
  if (s.ok()) return true;
  why = s.ToString();
  return false;
}

}  // namespace

// Write-ahead logs: RocksDB lists only the current one, so each check notes the logs it
// finds on disk, and reports a noted log that is gone while RocksDB still needs it (its
// number at least rocksdb.min-log-number-to-keep, read after the log was seen missing:
// RocksDB deletes a log only below that number, which never decreases).
void db::impl::missing_logs(std::vector<std::string>& missing) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
    if (e.path().extension() != ".log") continue;
    const auto stem = e.path().stem().string();
    if (stem.empty() || stem.find_first_not_of("0123456789") != std::string::npos) continue;
    known_logs.emplace(std::stoull(stem), e.path().string());
  }
  for (auto it = known_logs.begin(); it != known_logs.end();) {
    if (on_disk(it->second)) {
      ++it;
      continue;
    }
    uint64_t keep = 0;
    if (!rdb->GetIntProperty(rocksdb::DB::Properties::kMinLogNumberToKeep, &keep)) keep = UINT64_MAX;
    if (it->first >= keep) missing.push_back(it->second);
    it = known_logs.erase(it);  // reported once, or deleted by RocksDB
  }
}

status db::impl::verify_files() {
  std::lock_guard verifying(verify_mu);
  std::vector<std::string> missing;
  for (const auto& f : live_files(*rdb, path))
    if (!on_disk(f)) missing.push_back(f);
  if (!missing.empty()) {
    // Still live now, so RocksDB did not delete them meanwhile.
    auto again = live_files(*rdb, path);
    std::erase_if(missing, [&](const std::string& f) { return !again.count(f) || on_disk(f); });
  }
  missing_logs(missing);
  std::string why;
  // A log switch between RocksDB reading the current number and looking the file up
  // may let it see an old log already deleted: only two failures in a row count.
  if (missing.empty() && !current_wal_on_disk(*rdb, why) && !current_wal_on_disk(*rdb, why))
    missing.push_back("the current write-ahead log (" + why + ")");
  if (missing.empty()) return status::ok_status();
  std::string list;
  for (const auto& f : missing) list += (list.empty() ? "" : ", ") + f;
  auto s = status::corruption("a file of the database was deleted under it: " + list);
  std::lock_guard lock(damage_mu);
  if (damage.empty()) damage = s.message();
  return s;
}

void db::impl::start_verify(std::chrono::milliseconds every) {
  verify_thread = std::thread([this, every] {
    name_this_thread("ks-verify");
    std::unique_lock lock(thread_mu);
    while (!thread_cv.wait_for(lock, every, [&] { return stopping; })) {
      lock.unlock();
      status s = status::ok_status();
      // The thread's last resort: an exception is that pass's failure; the next runs.
      if (auto why = guarded([&] { s = verify_files(); })) s = status::internal("exception: " + *why);
      lock.lock();
      if (stopping) break;
      if (s.code() == status_code::corruption) {
        storage_log()->critical("{}: this state can no longer be trusted", s.message());
        break;  // the damage stays; the owner reopens
      }
      if (!s.ok()) storage_log()->warn("checking the database's files: {}", s.message());
    }
  });
}

void db::impl::stop_verify() {
  if (!verify_thread.joinable()) return;
  {
    std::lock_guard lock(thread_mu);
    stopping = true;
  }
  thread_cv.notify_all();
  verify_thread.join();
}

status db::verify_files() { return impl_->verify_files(); }

std::string db::must_reopen() const {
  std::lock_guard lock(impl_->damage_mu);
  return impl_->damage;
}

const std::optional<db::quarantine_info>& db::quarantined() const { return impl_->quarantined; }

}  // namespace kstate::storage
