# One image for every process of the Procfile / docker-compose.yml.
# The wheel is built in a first stage and only the installed package reaches the image: the
# processes run what `pip install` delivers (migrations and Celery settings included), never
# a source tree that the working directory could put first on sys.path.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md celeryconfig.py ./
COPY migrations ./migrations
COPY jobsapp ./jobsapp
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
# gunicorn binds 0.0.0.0:$PORT (jobsapp/web/gunicorn_conf.py): 8000 unless the platform sets it.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PORT=8000
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels && useradd --create-home jobsapp
USER jobsapp
WORKDIR /home/jobsapp
EXPOSE 8000 5555
# The Procfile's web line; docker-compose.yml names every process's command explicitly.
CMD ["gunicorn", "-c", "python:jobsapp.web.gunicorn_conf", "--workers", "2", "--access-logfile", "-", "jobsapp.web.app:create_app()"]
